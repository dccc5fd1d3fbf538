#!/usr/bin/env sh
# Create (or refresh) the project's virtual environment in .venv with every
# dependency the demo and the tests need.  Only Python >= 3.11 and pip needed.
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.hkv-installed
want=$(cat pyproject.toml | cksum)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setting up .venv (pip install -e '.[dev]') ..." >&2
  .venv/bin/python -m pip install --quiet --upgrade pip >&2
  .venv/bin/python -m pip install --quiet -e '.[dev]' >&2
  sh scripts/setup_remote.sh
  echo "$want" > "$stamp"
fi
