"""Release: a request ends; each role keeps what the index can use and gives back the rest.

The prefix role seals and publishes the page the request stopped in (so its
last resume point stays usable), referred to by the blocks it completed;
every pin of the request is dropped and every object it still owns is given
back, each in one lifecycle step.  The chain moves to the back of the
eviction order, deepest first, its deepest point becomes an anchor (taken
after the points nobody resumes at), and the request's reserved index rows
and slot are returned.
"""

from __future__ import annotations

from hkv_core.manager.core import Core
from hkv_core.manager.requests import RequestState
from hkv_core.manager.roles import Moves
from hkv_core.spec.names import Event


def release(core: Core, req: RequestState) -> None:
    objects, moves = core.objects, Moves()
    for role in core.roles:
        role.finish(req, moves)
    sealed = moves.take(Event.SEAL)
    objects.step(sealed, Event.SEAL, req.slot)
    objects.step(sealed, Event.PUBLISH, req.slot)
    core.index.attach(moves.attach)
    objects.step(moves.take(Event.ABORT), Event.ABORT, req.slot)
    pinned = req.pins.objs
    objects.step(pinned, Event.UNPIN, req.slot)
    req.pins.clear()
    objects.settle(pinned)
    core.index.unreserve(req.block_rows, req.point_rows)
    req.block_rows = req.point_rows = 0
    req.pending_points.clear()
    req.ahead.clear()  # its unverified reservations were aborted with its other private objects (never published)
    outputs = len(req.tokens) - req.prompt_tokens  # what an adaptive policy buckets new blocks by
    hint = getattr(core.index.policy, "hint", None)
    if hint is not None and outputs > 0:  # (a request that decoded nothing keeps the bucket a caller told it)
        hint(outputs)
    chain = req.chain.view()
    core.index.touch(chain)  # its whole chain was in use until now: its LRU entries, deepest first
    core.index.anchor_deepest(chain)  # the furthest a request repeating it resumes: eviction takes it last
    core.requests.forget(req)
