#!/usr/bin/env sh
# Quick start 2: set up and run every quality gate and the whole test suite.
# pytest exit 5 ("no tests collected") is a failure here, never a pass.
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup.sh
echo "== mypy --strict, every package" >&2
.venv/bin/mypy --strict hkv_core hkv_tiers hkv_exec_ref hkv_exec_cuda hkv_cli hkv_events hkv_vllm
echo "== ruff check" >&2
.venv/bin/ruff check .
echo "== pytest" >&2
set +e
# -n auto: one worker per core (pytest-xdist); HKV_TEST_WORKERS=0 runs in one process
.venv/bin/python -m pytest --durations=15 -n "${HKV_TEST_WORKERS:-auto}" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
[ "$rc" -eq 0 ] || exit "$rc"
# vLLM's own scheduler tests, stock and with hkv, then hkv_vllm's tests, in .venv-vllm (docs/vllm.md).
# HKV_SKIP_VLLM=1 skips this step (it says so); CI runs it.
if [ "${HKV_SKIP_VLLM:-0}" = 1 ]; then
  echo "== vLLM suite skipped (HKV_SKIP_VLLM=1)" >&2
  exit 0
fi
exec sh scripts/vllm_suite.sh
