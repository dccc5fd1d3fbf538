"""Reference engine loop: TinyV4 served through a CacheManager and the RefExecutor.

`Engine.tiny()` builds everything; `generate` serves through the cache, `recompute`
runs without it; the exactness oracle compares the two with np.array_equal.
"""

from hkv_exec_ref.engine.engine import Engine, EngineStats
from hkv_exec_ref.engine.results import ServeResult, cached_by_kind
from hkv_exec_ref.engine.speculative import DraftSpec

__all__ = ["DraftSpec", "Engine", "EngineStats", "ServeResult", "cached_by_kind"]
