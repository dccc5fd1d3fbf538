"""What the manager state machine knows about requests: its model of live and committed requests."""

from __future__ import annotations

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.manager import CacheManager


@attrs.define(kw_only=True)
class ModelRequest:
    """What the machine knows about one live request."""

    rid: int
    salt: str | None
    tokens: NDArray[np.int64]
    prompt_tokens: int
    computed: int = 0
    allocated: int = 0
    hit_tokens: int = 0
    junction: int = 0  # its last match's candidate past the hit: the manager keeps a point there (retain_junction)
    acquired: bool = False
    since: int | None = None  # the manager's eviction count when the request first pinned or owned anything
    plans: set[int] = attrs.field(factory=set)  # copy plans in flight
    failed: bool = False  # a copy plan of it failed: it can never commit again


@attrs.frozen(kw_only=True)
class Committed:
    """What one request has committed: tokens [0, len(tokens)) after resuming at `start`."""

    salt: str | None
    tokens: NDArray[np.int64]
    start: int
    prompt_tokens: int
    evictions: int  # the manager's eviction count when the request first pinned or owned anything
    junction: int = 0  # where its last match left the cached chain past its hit (0: nowhere)
    released: bool = False  # its release sealed and published the prefix page it stopped in


def evictions(manager: CacheManager) -> int:
    """Units the manager has evicted so far (explicitly or to make room)."""
    stats = manager.stats
    return stats["evicted_blocks"] + stats["evicted_points"]
