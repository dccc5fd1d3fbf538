"""Release: a request ends; drop its pins, free what it owns, forget it."""

from __future__ import annotations

import numpy as np

from hkv_core.manager.commit import unpin
from hkv_core.manager.core import Core, RequestState


def release(core: Core, req: RequestState) -> None:
    for pool in range(len(core.infos)):
        unpin(core, req, pool, np.array(sorted(req.pinned_versions[pool]), np.int32))
        owned = np.array(sorted(req.owned[pool]), np.int32)
        core.pools[pool].step(owned, "abort", req.rid)
        req.owned[pool].clear()
    req.snapshots.clear()
    del core.requests[req.rid]
