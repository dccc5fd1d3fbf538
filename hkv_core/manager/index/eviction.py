"""The eviction policy a manager runs, chosen at construction (`ManagerConfig.eviction`, or a factory).

`lru` (the default): exact LRU, deepest first within a chain (policy.py).
`adaptive`: admission by learned reuse, then recency with a use-rate bonus
chosen by shadow caches (adaptive.py; docs/replay.md).  Both keep children
before parents, so eviction stays dependency aware; the manager tells an
adaptive policy each released request's output tokens (the tokens appended
after `add_request`), what its admission buckets read.

A factory `(block_rows, block_keys) -> EvictionPolicy` passed to the
CacheManager runs any other policy (the replay's offline Belady optimum).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.config import EVICTIONS
from hkv_core.manager.index.adaptive import AdaptivePolicy
from hkv_core.manager.index.policy import EvictionPolicy, LruPolicy

PolicyFactory = Callable[[int, NDArray[np.uint64]], EvictionPolicy]  # (block rows, the block table's keys)


def build_policy(eviction: str, block_rows: int, keys: NDArray[np.uint64]) -> EvictionPolicy:
    """The policy `eviction` names, for a block table of `block_rows` rows whose key column is `keys`."""
    if eviction == "adaptive":
        return AdaptivePolicy(block_rows, keys)
    assert eviction == EVICTIONS[0], eviction  # ManagerConfig checked it
    return LruPolicy(block_rows)
