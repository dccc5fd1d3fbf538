"""hkv_vllm.Scheduler: vLLM's scheduler with hkv's KV cache manager.

Load it by import path: `vllm serve ... --scheduler-cls hkv_vllm.Scheduler`
or `LLM(..., scheduler_cls="hkv_vllm.Scheduler")`; with `--async-scheduling`,
`hkv_vllm.AsyncScheduler`.  vLLM's scheduler builds
its manager itself from a module-level name; this subclass builds it with
that name bound to `HkvKVCacheManager` (same arguments), under a lock, and
everything else is vLLM's own scheduling, KV connectors included (what the
manager does with a connector's tokens: docs/vllm.md).

hkv's own options come in vLLM's plugin configuration, `additional_config`
(`--additional-config '{"hkv": {"fine_hits": true}}'`, or
`LLM(..., additional_config={"hkv": {"fine_hits": True}})`): `fine_hits`
resumes at every 16-token block, inside vLLM's blocks, with the partial
last block copied on write by vLLM's worker (`copies.py`);
`wait_for_shared_prefills` (on by default) leaves a waiting request for a
step while a request in flight computes prompt blocks it shares, so it
resumes from them (`in_flight.py`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

from vllm.v1.core.sched import async_scheduler as vllm_async
from vllm.v1.core.sched import scheduler as vllm_scheduler

from hkv_vllm.errors import UnsupportedVllmConfig
from hkv_vllm.manager import HkvKVCacheManager

OPTIONS = {"fine_hits": bool, "wait_for_shared_prefills": bool}  # additional_config["hkv"]: name -> type

_BUILD_LOCK = threading.Lock()


def hkv_options(vllm_config: Any) -> dict[str, Any]:
    """hkv's options from `vllm_config.additional_config["hkv"]` (UnsupportedVllmConfig naming an unknown
    option or a value of the wrong type)."""
    extra = getattr(vllm_config, "additional_config", None)
    options = extra.get("hkv", {}) if isinstance(extra, dict) else {}
    if not isinstance(options, dict):
        raise UnsupportedVllmConfig(feature="additional_config.hkv", detail=f"must be a dict, got {options!r}")
    for name, value in options.items():
        if name not in OPTIONS or type(value) is not OPTIONS[name]:
            raise UnsupportedVllmConfig(feature=f"additional_config.hkv.{name}",
                                        detail=f"{value!r} (hkv's options: "
                                               f"{', '.join(f'{k}: {t.__name__}' for k, t in OPTIONS.items())})")
    return dict(options)


def _manager(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """HkvKVCacheManager with the options of the scheduler's vLLM config (its first argument)."""
    return functools.partial(HkvKVCacheManager, **hkv_options(kwargs.get("vllm_config", args[0] if args else None)))


@contextlib.contextmanager
def manager_class(cls: Any) -> Iterator[None]:
    """Bind the scheduler module's `KVCacheManager` to `cls` while a scheduler is built."""
    with _BUILD_LOCK:
        stock = vllm_scheduler.KVCacheManager
        vllm_scheduler.KVCacheManager = cls
        try:
            yield
        finally:
            vllm_scheduler.KVCacheManager = stock


class _WaitsForSharedPrefills:
    """vLLM's check whether a waiting request is ready, then hkv's: a request that shares a prompt block being
    computed in a step in flight waits for it (`in_flight.py`)."""

    kv_cache_manager: HkvKVCacheManager

    def _handle_blocked_waiting_request(self, request: Any) -> bool:
        return bool(super()._handle_blocked_waiting_request(request)  # type: ignore[misc]
                    and not self.kv_cache_manager.waits_for_prefill_in_flight(request))


class Scheduler(_WaitsForSharedPrefills, vllm_scheduler.Scheduler):
    """vLLM's v1 Scheduler whose `kv_cache_manager` is an `HkvKVCacheManager`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with manager_class(_manager(args, kwargs)):
            super().__init__(*args, **kwargs)


class AsyncScheduler(_WaitsForSharedPrefills, vllm_async.AsyncScheduler):
    """vLLM's async scheduler (`--async-scheduling`) whose `kv_cache_manager` is an `HkvKVCacheManager`: each
    step's slots are reserved ahead of the token the step before it has not sampled yet."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with manager_class(_manager(args, kwargs)):
            super().__init__(*args, **kwargs)

        self.kv_cache_manager.prefills_in_flight.steps = 2  # step n+1 is scheduled before step n is written
