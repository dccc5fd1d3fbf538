"""A pytest plugin that runs vLLM's tests with hkv's KV cache manager: `pytest -p hkv_vllm.suite.plugin`.

Before the tests are collected it binds `KVCacheManager` to
`HkvKVCacheManager` in the two modules vLLM's scheduler and tests take it
from, so every scheduler (and every manager a test builds) is hkv's.
"""

from __future__ import annotations

from typing import Any


def pytest_configure(config: Any) -> None:
    from vllm.v1.core import kv_cache_manager
    from vllm.v1.core.sched import scheduler

    from hkv_vllm.manager import HkvKVCacheManager

    scheduler.KVCacheManager = HkvKVCacheManager
    kv_cache_manager.KVCacheManager = HkvKVCacheManager  # type: ignore[misc]
