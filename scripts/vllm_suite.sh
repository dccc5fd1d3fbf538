#!/usr/bin/env sh
# vLLM's own scheduler tests, stock and with hkv's manager (docs/vllm.md), then hkv_vllm's own tests.
# Sets up .venv-vllm first (scripts/setup_vllm.sh).  Exit 1 when hkv passes fewer of vLLM's tests
# than the stored run (benchmarks/results/vllm_suite.json) or when hkv_vllm's tests fail.
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup_vllm.sh
echo "== vLLM's scheduler tests, stock and with hkv" >&2
.venv-vllm/bin/python -m hkv_vllm.suite.run --baseline benchmarks/results/vllm_suite.json "$@"
echo "== hkv_vllm's tests (.venv-vllm)" >&2
.venv-vllm/bin/python -m pytest tests/vllm_plugin -p no:cacheprovider -rs  # -rs: skip reasons (HKV_VLLM_E2E=1 runs the engine check)
