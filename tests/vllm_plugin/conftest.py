"""hkv_vllm's tests run in .venv-vllm (scripts/vllm_suite.sh); without vLLM every test here skips.

vLLM reads the Hugging Face hub cache location when it is first imported,
so the config-only cache (hkv_vllm/suite/hub_cache.py) is written and named
here, before any test module imports vLLM.
"""

import importlib.util
import os
import tempfile
from pathlib import Path

HAS_VLLM = importlib.util.find_spec("vllm") is not None
SKIP_REASON = "needs vLLM: run sh scripts/vllm_suite.sh (sets up .venv-vllm with the vllm extra)"

if HAS_VLLM:
    from hkv_vllm.suite.hub_cache import write_hub_cache

    hub = Path(tempfile.mkdtemp(prefix="hkv-vllm-hub-"))
    write_hub_cache(hub)
    os.environ.update(VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                      VLLM_ALLOW_LONG_MAX_MODEL_LEN="1", HF_HUB_CACHE=str(hub))
