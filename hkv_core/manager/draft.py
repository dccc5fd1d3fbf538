"""Speculative steps: propose draft tokens, then accept a prefix of them or reject them all.

A request has two watermarks: its verified tokens (`req.tokens`, every one
hashed into block keys as it arrives) and, while a step is in flight, the
speculative end `verified + k`.  A step reserves only what tokens
[computed, verified + k) can use, every object DRAFT (owned by the request,
out of the index's sight): window and prefix pages past the request's
tables, written in place like any allocation; one tail page per run of
accepted ends whose tail rows start alike; a snapshot page per retained
boundary.  The request's working tail is read, never written: it is the
checkpoint a rejection returns to; the step's plan copies it into the first
tail page (where that page's tail starts at the same row), for verification
kernels that update a tail in place.  Draft tokens join `req.tokens` (and get
keys) only when accepted, so no key, block, resume point or event ever
covers an unverified token.

`settle(end)` keeps tokens [computed, end): the DRAFT objects they use are
accepted (they become the request's RESERVED objects, exactly those an
allocation of those tokens would have reserved), the page holding the tail
at `end` becomes the working tail, and everything else is rejected (freed,
its version bumped).  `end == computed` returns the request to exactly its
state before the step.  Tokens [computed, end) are then committed as usual.
"""

from __future__ import annotations

import numpy as np

from hkv_core.manager import admit, retention
from hkv_core.manager.allocate import issue, make_room
from hkv_core.manager.core import Core
from hkv_core.manager.records import Allocation
from hkv_core.manager.requests import DraftState, RequestState
from hkv_core.manager.roles import Builder, Moves
from hkv_core.manager.roles.base import NO_DEMAND, Demand
from hkv_core.spec.names import Event


def _blocks_needed(core: Core, req: RequestState, end: int) -> int:
    """Index rows tokens up to `end` need for blocks not yet chained or reserved (as allocate counts them)."""
    return max(0, end // core.block_tokens - len(req.chain) - req.block_rows)


def propose(core: Core, req: RequestState, tokens: np.ndarray) -> Allocation:
    """Reserve a step over the verified tokens not yet computed and the draft `tokens` (checked by the caller:
    1-D int64, at least one, within the request's length cap); OutOfPages leaves everything as it was."""
    start, end = req.computed, len(req.tokens) + len(tokens)
    boundaries = retention.retained_between(core, req, start, end)
    demands: list[Demand] = [NO_DEMAND] * len(core.pools)
    for role in core.roles:
        for pool, demand in zip(role.pools, role.draft_demands(req, start, end, boundaries), strict=True):
            demands[pool.index] = demand
    blocks = _blocks_needed(core, req, end)
    make_room(core, [d[0] for d in demands], blocks, len(boundaries))
    got = core.objects.reserve(demands, req.slot, Event.RESERVE_DRAFT)
    draft = DraftState(start=start, verified=len(req.tokens), tokens=tokens, table_lens=[len(t) for t in req.tables],
                       segments={}, snapshots={}, boundaries=boundaries, blocks=blocks, points=len(boundaries))
    out = Builder()
    for role in core.roles:
        role.draft_place(req, start, end, boundaries, [got[p.index] for p in role.pools], out, draft)
    core.index.reserve(blocks, len(boundaries))
    req.draft = draft
    plan = issue(core, req, out, f"propose {start}+{end - start}")
    draft.plan = plan.plan_id if plan is not None else -1
    return Allocation(request_id=req.rid, start_tokens=start, num_tokens=end - start, block_tables=out.tables,
                      slots=out.slots, tail_pages=out.tail_pages, snapshots=out.snapshots,
                      draft_tails=out.draft_tails, draft_tokens=len(tokens), plan=plan)


def settle(core: Core, req: RequestState, end: int) -> None:
    """Keep tokens [computed, end) of the step (`end` is computed, or in [verified, verified + k]); the accepted
    draft tokens join the request's tokens; everything else the step reserved is freed."""
    draft = req.draft
    assert draft is not None and (end == draft.start or draft.verified <= end <= draft.end), (end, draft)
    if end > draft.verified:
        admit.append_tokens(core, req, draft.tokens[:end - draft.verified])  # checked at propose: cannot fail
    moves = Moves()
    for role in core.roles:
        role.settle_draft(req, draft, end, moves)
    objects = core.objects
    for event in (Event.ACCEPT, Event.REJECT, Event.ABORT):
        objects.step(moves.take(event), event, req.slot)
    kept = [b for b in draft.boundaries if b <= end]
    blocks = _blocks_needed(core, req, end)
    core.index.unreserve(draft.blocks - blocks, draft.points - len(kept))
    req.block_rows += blocks
    req.point_rows += len(kept)
    req.pending_points += kept
    req.allocated = max(end, draft.start)
    if req.failed_plan == draft.plan >= 0:  # the failed copy filled a page the step no longer has
        req.failed_plan = -1
    req.draft = None
