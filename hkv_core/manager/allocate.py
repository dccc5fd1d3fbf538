"""Allocate: pages, slot mappings and copy plan for a request's next tokens, all or nothing.

What the tokens need is counted first (objects per page pool, block rows for
the blocks they complete, point rows for the points they keep); if anything
is short the manager evicts (LRU, dependency aware) rather than growing; if
still short, OutOfPages is raised and nothing changed (F8).  The objects of
every pool are reserved in one lifecycle step.  The copies the tokens need
first (copy-on-write of the hit's partial page, seeding the working tail)
are issued as one plan with an id; the copies' targets are FILLING until
`complete(plan_id)`.

Objects whose first row needs a token the request does not know yet (slots
reserved ahead: `allocate_ahead`, or a compressed page the last known token
only begins) are reserved AHEAD; `append_tokens` verifies them once their
tokens are known.  Nothing AHEAD can be published (the lifecycle table has
no such edge), and `commit` never passes the known tokens.
"""

from __future__ import annotations

import numpy as np

from hkv_core.errors import OutOfPages
from hkv_core.manager import evict, retention
from hkv_core.manager.core import Core, PlanRecord
from hkv_core.manager.records import Allocation
from hkv_core.manager.requests import RequestState
from hkv_core.manager.roles import Builder
from hkv_core.manager.roles.base import NO_DEMAND, Demand
from hkv_core.plan import Plan
from hkv_core.spec.names import Event

BLOCK_ROWS, POINT_ROWS = "block index", "resume-point index"  # OutOfPages.pool for the index tables
SHARED_SPACE = "shared block space"  # OutOfPages.pool for the pages every pool draws from (shared_pages)


def needs(core: Core, req: RequestState, start: int, end: int) -> tuple[list[Demand], int, int, list[int]]:
    """(demand per page pool, block rows, point rows, boundaries of the points) tokens [start, end) need."""
    boundaries = retention.retained_between(core, req, start, end)
    demands: list[Demand] = [NO_DEMAND] * len(core.pools)
    for role in core.roles:
        for pool, demand in zip(role.pools, role.demands(req, start, end, boundaries), strict=True):
            demands[pool.index] = demand
    blocks = max(0, end // core.block_tokens - len(req.chain) - req.block_rows)
    return demands, blocks, len(boundaries), boundaries


def fits(core: Core, pages: list[int], blocks: int, points: int) -> bool:
    """Would the free pages and rows cover the need without evicting?"""
    return (all(not n or p.free_count >= n for p, n in zip(core.pools, pages, strict=True))
            and all(sum(pages) <= space.count for space in core.objects.spaces)
            and (not blocks or core.index.blocks.available() >= blocks)
            and (not points or core.index.points.available() >= points))


def make_room(core: Core, pages: list[int], blocks: int, points: int) -> None:
    """Evict until the free pages and rows cover the need; OutOfPages (nothing evicted) when eviction cannot."""
    if not fits(core, pages, blocks, points):
        evictable = evict.evict_for(core, pages, blocks, points)
        if evictable is not None:
            raise _short(core, pages, blocks, points, evictable)


def allocate(core: Core, req: RequestState, num_tokens: int, step_start: int = -1) -> Allocation:
    """Pages for tokens [allocated, allocated + n) of a step beginning at `step_start` (-1: not said); a request
    that never acquired starts at 0."""
    start, end = req.allocated, req.allocated + num_tokens
    req.step_start = step_start  # (read by the roles' demands and place; -1 again once placed or refused)
    try:
        demands, blocks, points, boundaries = needs(core, req, start, end)
        make_room(core, [d[0] for d in demands], blocks, points)
        got = core.objects.reserve(demands, req.slot, known=len(req.tokens))
        note_ahead(core, req, got)
        out = Builder()
        for role in core.roles:
            role.place(req, start, end, boundaries, [got[p.index] for p in role.pools], out)
    finally:
        req.step_start = -1
    core.index.reserve(blocks, points)
    req.block_rows += blocks
    req.point_rows += points
    req.pending_points += boundaries
    req.allocated, req.acquired = end, True
    return Allocation(request_id=req.rid, start_tokens=start, num_tokens=num_tokens, block_tables=out.tables,
                      slots=out.slots, tail_pages=out.tail_pages, snapshots=out.snapshots,
                      plan=issue(core, req, out, f"allocate {start}+{num_tokens}"))


def note_ahead(core: Core, req: RequestState, got: list[np.ndarray]) -> None:
    """Remember the objects just reserved AHEAD (past the known tokens): append_tokens verifies them."""
    o = core.objects
    for objs in got:
        if objs.size:
            req.ahead += objs[o.ahead[o.code[objs]]].tolist()


def verify_known(core: Core, req: RequestState) -> None:
    """The request's known tokens grew: its AHEAD objects whose first row they cover are verified
    (AHEAD -> RESERVED, same page: an engine's block tables stay valid); the rest stay AHEAD."""
    if not req.ahead:
        return
    objs = np.array(req.ahead, np.intp)
    known = core.objects.row_token[objs] <= len(req.tokens)
    core.objects.step(objs[known], Event.VERIFY, req.slot)
    req.ahead = objs[~known].tolist()


def issue(core: Core, req: RequestState, out: Builder, label: str) -> Plan | None:
    """The copies as a plan with an id; their targets are FILLING (copy-pinned) until it completes."""
    if not out.copies:
        return None
    plan_id, core.next_plan = core.next_plan, core.next_plan + 1
    fills = np.array(out.fills, np.intp)
    core.objects.step(fills, Event.FILL, req.slot)
    core.plans[plan_id] = PlanRecord(request_id=req.rid, fills=fills)
    req.plans.add(plan_id)
    core.stats["copies"] += len(out.copies)
    return Plan(ops=out.copies, request_id=req.rid, plan_id=plan_id, label=label)


def _short(core: Core, pages: list[int], blocks: int, points: int, evictable: list[int]) -> OutOfPages:
    """OutOfPages for the first pool or index table that eviction cannot make supply the need (`evictable`:
    what eviction could free per resource; nothing was evicted)."""
    rows = core.index.blocks, core.index.points
    sizes = [(p.name, p.own_free, p.size) for p in core.pools] + [
        (SHARED_SPACE, space.count, space.slots - 1) for space in core.objects.spaces] + [
        (name, table.available(), table.capacity) for name, table in zip((BLOCK_ROWS, POINT_ROWS), rows, strict=True)]
    needs = [*pages, *(sum(pages) for _ in core.objects.spaces), blocks, points]
    short = [i for i, ((_, free, _), n, e) in enumerate(zip(sizes, needs, evictable, strict=True)) if free + e < n]
    assert short, "eviction failed only if some resource cannot be covered"
    name, free, size = sizes[i := short[0]]
    return OutOfPages(pool=name, needed=needs[i], free=free, evictable=evictable[i],
                      held=max(0, size - free - evictable[i]), capacity=size)
