"""Release: a request ends; each role keeps what the index can use and gives back the rest.

The prefix role seals and publishes the page the request stopped in (so its
last resume point stays usable); every role then drops the request's pins
and gives back the objects it still owns.  The chain moves to the back of
the eviction order, deepest first, and the request's reserved index rows
and slot are returned.
"""

from __future__ import annotations

from hkv_core.manager.core import Core
from hkv_core.manager.requests import RequestState


def release(core: Core, req: RequestState) -> None:
    for role in core.roles:
        role.release(req)
    core.index.unreserve(req.block_rows, req.point_rows)
    req.block_rows = req.point_rows = 0
    req.pending_points.clear()
    core.index.touch(req.chain.view())  # its whole chain was in use until now (LRU order)
    core.requests.forget(req)
