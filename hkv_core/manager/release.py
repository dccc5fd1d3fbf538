"""Release: a request ends; drop its pins, free what it owns, forget it."""

from __future__ import annotations

import numpy as np

from hkv_core.manager.commit import unpin
from hkv_core.manager.core import Core, RequestState


def release(core: Core, req: RequestState) -> None:
    for pool, p in enumerate(core.pools):
        pins, owned = req.pinned_versions[pool], req.owned[pool]
        if pins:
            unpin(core, req, pool, np.fromiter(pins, np.intp, len(pins)))
        if owned:
            p.step(np.fromiter(owned, np.intp, len(owned)), "abort", req.rid)
            owned.clear()
    req.snapshots.clear()
    core.arena.touch(req.chain.view())  # its whole chain was in use until now (LRU order)
    del core.requests[req.rid]
