"""hkv_vllm.Scheduler: vLLM's scheduler with hkv's KV cache manager.

Load it by import path: `vllm serve ... --scheduler-cls hkv_vllm.Scheduler`
or `LLM(..., scheduler_cls="hkv_vllm.Scheduler")`; with `--async-scheduling`,
`hkv_vllm.AsyncScheduler`.  vLLM's scheduler builds
its manager itself from a module-level name; this subclass builds it with
that name bound to `HkvKVCacheManager` (same arguments), under a lock, and
everything else is vLLM's own scheduling, KV connectors included (what the
manager does with a connector's tokens: docs/vllm.md).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from vllm.v1.core.sched import async_scheduler as vllm_async
from vllm.v1.core.sched import scheduler as vllm_scheduler

from hkv_vllm.manager import HkvKVCacheManager

_BUILD_LOCK = threading.Lock()


@contextlib.contextmanager
def manager_class(cls: type) -> Iterator[None]:
    """Bind the scheduler module's `KVCacheManager` to `cls` while a scheduler is built."""
    with _BUILD_LOCK:
        stock = vllm_scheduler.KVCacheManager
        vllm_scheduler.KVCacheManager = cls
        try:
            yield
        finally:
            vllm_scheduler.KVCacheManager = stock


class Scheduler(vllm_scheduler.Scheduler):
    """vLLM's v1 Scheduler whose `kv_cache_manager` is an `HkvKVCacheManager`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with manager_class(HkvKVCacheManager):
            super().__init__(*args, **kwargs)


class AsyncScheduler(vllm_async.AsyncScheduler):
    """vLLM's async scheduler (`--async-scheduling`) whose `kv_cache_manager` is an `HkvKVCacheManager`: each
    step's slots are reserved ahead of the token the step before it has not sampled yet."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with manager_class(HkvKVCacheManager):
            super().__init__(*args, **kwargs)

