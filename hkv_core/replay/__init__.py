"""Trace replay: Mooncake-format traces through the CacheManager's metadata path (docs/replay.md)."""

from hkv_core.replay.run import POLICIES, ReplayConfig, ReplayResult, replay
from hkv_core.replay.trace import TraceRequest, read_trace

__all__ = ["POLICIES", "ReplayConfig", "ReplayResult", "TraceRequest", "read_trace", "replay"]
