"""Release: a request ends; drop its pins, free what it owns, forget it."""

from __future__ import annotations

import numpy as np

from hkv_core.manager.arena import NO_BLOCK
from hkv_core.manager.commit import unpin
from hkv_core.manager.core import Core, RequestState, chain_tail


def release(core: Core, req: RequestState) -> None:
    for pool in range(len(core.infos)):
        unpin(core, req, pool, np.array(sorted(req.pinned_versions[pool]), np.int32))
        owned = np.array(sorted(req.owned[pool]), np.int32)
        core.pools[pool].step(owned, "abort", req.rid)
        req.owned[pool].clear()
    req.snapshots.clear()
    core.move_chain_tail(chain_tail(req), NO_BLOCK)
    del core.requests[req.rid]
