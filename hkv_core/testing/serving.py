"""One request served whole on a CacheManager with no executor: what tests do to put a prompt in the cache."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager import CacheManager, Hit
from hkv_core.plan import Completion

__all__ = ["serve_whole"]


def serve_whole(m: CacheManager, tokens: NDArray[np.int64]) -> Hit:
    """Add, match, acquire, allocate the rest (its copies completed at once: no bytes move), commit and release;
    the hit it resumed from."""
    rid = m.add_request(tokens)
    hit = m.match(rid)
    m.acquire(rid, hit)
    alloc = m.allocate(rid, len(tokens) - hit.tokens)
    if alloc.plan is not None:
        m.complete(alloc.plan.plan_id, Completion())
    m.commit(rid, len(tokens) - hit.tokens)
    m.release(rid)
    return hit
