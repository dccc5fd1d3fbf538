"""Eviction: LRU over units (resume points, leaf blocks), dependency aware, planned and applied in bulk.

Units come from the index's eviction order (a `children_first` policy): for
each block, its resume point (if kept and no lease pins its tail), then the
block itself if it is on no live request's chain and no lease pins its
prefix pages.  Blocks of live chains and pinned blocks form an
ancestor-closed set (a chain is a prefix; a pinned page's blocks lead back
to the pinning request's chain), and every other block comes after all its
descendants, so each unit in order can go once the ones before it have gone:
a chunk of the order is screened with a few array operations, no loop per
unit (F9: a block goes only as a leaf, after its point; a point goes before
the pages it refers to).

Eviction for an allocation is planned on virtual reference counts: a unit's
references are counted against each object's holders, and an object frees
its page at the unit dropping its last reference (if nothing pins it).  The
plan is carried out only if it frees enough in every pool and index table
the allocation needs (F8: a failed allocation evicts nothing).  Beyond the
need it frees a low-water margin (`evict_slack_shift`), so eviction runs on
a few percent of allocations.
"""

from __future__ import annotations

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.core import Core
from hkv_core.manager.index import NO_POINT
from hkv_core.manager.page_pools import NULL_OBJECT, PagePools

Index = NDArray[np.intp]
Blocks = NDArray[np.int32]


@attrs.define
class Walk:
    """Units planned so far, in order, and where each resource's frees happen."""

    points: list[Blocks] = attrs.field(factory=list)
    point_pos: list[Index] = attrs.field(factory=list)
    blocks: list[Blocks] = attrs.field(factory=list)
    block_pos: list[Index] = attrs.field(factory=list)
    freed: list[list[Index]] = attrs.field(factory=list)  # per resource: positions of frees (pools, rows)
    touched: list[Index] = attrs.field(factory=list)
    dropped_refs: list[tuple[NDArray[np.int32], Index]] = attrs.field(factory=list)  # (objects, unit position)
    freed_objects: list[tuple[Index, Index]] = attrs.field(factory=list)  # (objects, position freed at)
    planned: NDArray[np.bool_] = attrs.field(factory=lambda: np.zeros(0, np.bool_))  # per point row: planned
    units: int = 0
    base: int = 0


@attrs.frozen
class Pass:
    """One pass over the eviction order: which units it may plan."""

    points_only: bool = False  # plan points, never blocks
    anchors: bool | None = None  # only points that are anchors (True), only others (False), any (None)
    running: bool = False  # a chunk of live chains' blocks: their points may go (never the blocks)
    spare: str | None = None  # running: "branches" spares points where indexed chains branch, "latest" also
    #                           those on several live chains and each live chain's deepest; None spares none


# Passes in order: the points behind running requests that nobody resumes at (periodic ones, a window long
# passed) but where chains branch - then the anchors behind one running request but its latest (its window
# passed them; as vLLM frees a running request's blocks that leave its window before those of requests that
# finish later), then the order as it is (released chains' points and blocks, LRU), then each running
# request's latest point (where it resumes if preempted, where its next turn hits) and those where chains
# meet or branch (where the next one arrives).  A pass skips what an earlier one planned.  (Released
# chains' periodic points are not taken before their anchors: on the Mooncake trace a request branches off
# at any block of an earlier one, not at its prompt's end.)
PASSES = (Pass(points_only=True, anchors=False, running=True, spare="branches"),
          Pass(points_only=True, running=True, spare="latest"), Pass(), Pass(points_only=True, running=True))
# With state columns (vLLM's Mamba groups) a running request's anchors are not passed by a window: the state at
# its prompt's end is where its next turn resumes, and vLLM keeps it cached in LRU order (its replay boundary), so
# they go with the released chains' units, in the order as it is; and the last pass spares the points where
# indexed chains branch (a junction running requests share: every next turn of each branch resumes there, and
# vLLM keeps it, preempting a request instead - the allocation is refused).
STATE_PASSES = (PASSES[0], PASSES[2], Pass(points_only=True, running=True, spare="branches"))


def _chunk_units(core: Core, walk: Walk, chunk: Blocks, live: NDArray[np.bool_], how: Pass) -> None:
    """Plan the units one pass allows of one chunk of the eviction order (positions continue the walk's).  The
    points of blocks on live chains are in use: they are planned only in a running pass (a chunk of such
    blocks), never in the policy's order, where such a block's place is that of its last release."""
    blocks, table = core.index.blocks, core.index.points
    pts = blocks.point[chunk]
    has_point = pts != NO_POINT
    planned = has_point & walk.planned[np.where(has_point, pts, 0)]
    point_unit = has_point & ~planned & (how.running | ~live[chunk])
    if how.anchors is not None:
        point_unit &= table.anchor[np.where(has_point, pts, 0)] == how.anchors
    if point_unit.any():  # unless a lease pins its tail (a pinned block's point may go)
        where = np.flatnonzero(point_unit)
        for role in core.roles:
            point_unit[where] &= ~role.points_pinned(pts[where])
    if how.points_only:
        block_unit = np.zeros(len(chunk), np.bool_)
    else:
        pinned = np.zeros(len(chunk), np.bool_)  # blocks whose prefix pages a lease pins
        for role in core.roles:
            pinned |= role.blocks_pinned(chunk)
        block_unit = ~live[chunk] & ~pinned & (point_unit | planned | ~has_point)  # a block goes after its point
    pos = 2 * (walk.base + np.arange(len(chunk), dtype=np.intp))
    walk.base += len(chunk)
    points, p_pos = pts[point_unit], pos[point_unit]
    walk.planned[points] = True
    dropped, b_pos = chunk[block_unit], pos[block_unit] + 1
    walk.points.append(points)
    walk.point_pos.append(p_pos)
    walk.blocks.append(dropped)
    walk.block_pos.append(b_pos)
    walk.units += len(points) + len(dropped)
    refs = [r for role in core.roles for r in role.refs(points, p_pos, dropped, b_pos)]
    pools = len(core.pools)
    if refs:
        objs, at = np.concatenate([r[0] for r in refs]), np.concatenate([r[1] for r in refs])
        walk.dropped_refs.append((objs, at))
        freed, pos = _freed(walk, core.objects, objs, at)
        walk.freed_objects.append((freed, pos))
        of_pool = core.objects.pool[freed]
        for p in range(pools):
            walk.freed[p].append(pos[of_pool == p])
        for s in range(len(core.objects.spaces)):  # one space for every pool: each freed object frees a page
            walk.freed[pools + s].append(pos)
    spaces = len(core.objects.spaces)
    walk.freed[pools + spaces].append(b_pos)
    walk.freed[pools + spaces + 1].append(p_pos)


def _freed(walk: Walk, pool: PagePools, objs: NDArray[np.int32], at: Index) -> tuple[Index, Index]:
    """Objects of `objs` (one reference dropped each, at `at`) that lose their last reference and nobody
    pins, and the position at which each does."""
    real = objs != NULL_OBJECT
    ids, at = objs[real].astype(np.intp), at[real]
    if not ids.size:
        return ids, at
    order = np.lexsort((at, ids))
    o: Index = ids[order]
    p: Index = at[order]
    first = np.ones(len(o), np.bool_)
    first[1:] = o[1:] != o[:-1]
    index = np.arange(len(o))
    rank = index - np.maximum.accumulate(np.where(first, index, 0)) + 1
    total = pool.vdrop[o] + rank
    free = (total == pool.holders[o]) & (pool.leases[o] == 0) & (pool.copies[o] == 0)
    last = np.ones(len(o), np.bool_)
    last[:-1] = first[1:]
    pool.vdrop[o[last]] += rank[last].astype(np.int32)
    walk.touched.append(o[last])
    return o[free], p[free]


def _cut(walk: Walk, needs: list[int]) -> int | None:
    """The position of the last unit needed to meet every need (-1: nothing needed), None if unmet."""
    cut = -1
    for need, positions in zip(needs, walk.freed, strict=True):
        if need <= 0:
            continue
        found = np.concatenate(positions) if positions else np.zeros(0, np.intp)
        if len(found) < need:
            return None
        cut = max(cut, int(np.partition(found, need - 1)[need - 1]))
    return cut


def _walk(core: Core, needs: list[int], max_units: int | None, passes: tuple[Pass, ...] = PASSES) -> Walk:
    """Plan units in eviction order until `needs` are met (or `max_units` planned, or the order ends), in
    `passes` over it."""
    walk = Walk(freed=[[] for _ in range(len(needs))], planned=core.index.points.evicting)
    live = np.zeros(core.index.blocks.capacity, np.bool_)
    for req in core.requests.live():
        live[req.chain.view()] = True
    passes = passes if core.needs_points else (Pass(),)  # without points: the order as it is
    if passes is PASSES and core.state_columns:
        passes = STATE_PASSES
    try:
        for how in passes:
            chunks = [_running_points(core, how.spare)] if how.running else core.index.policy.chunks()
            for chunk in chunks:
                _chunk_units(core, walk, chunk, live, how)
                if (max_units is not None and walk.units >= max_units) or (
                        any(needs) and _cut(walk, needs) is not None):
                    return walk
        return walk
    finally:
        for objs in walk.touched:
            core.objects.vdrop[objs] = 0
        for points in walk.points:
            walk.planned[points] = False


def _running_points(core: Core, spare: str | None = None) -> Blocks:
    """The blocks of live chains that hold points: last in the eviction order, as in use now (the order places
    a block at its last release, and a live request's new blocks join it at its own); only their points can go
    (the blocks are on live chains).  Those on fewer live chains first (a point many running requests share is
    where the next one arrives), then the shallowest (a running request's window passed them first; its
    latest points are what it resumes at if preempted).  `spare` leaves out the points where indexed chains
    branch ("branches"), and also those on several live chains and each live chain's deepest ("latest")."""
    blocks = core.index.blocks
    chains = [req.chain.view() for req in core.requests.live()]
    if not chains:
        return np.zeros(0, np.int32)
    held = [c[blocks.point[c] != NO_POINT] for c in chains]
    ids = np.concatenate(held)
    found, first, sharing = np.unique(ids, return_index=True, return_counts=True)
    depth = np.concatenate([np.arange(len(h)) for h in held])
    ranked = np.lexsort((depth[first], sharing))
    order = np.asarray(found[ranked], np.int32)
    if spare is None:
        return order
    spared = blocks.kept_children(order.astype(np.intp), leaving=False) > 1  # where indexed chains branch
    if spare == "latest":
        spared |= np.isin(order, np.asarray([h[-1] for h in held if len(h)], np.int32)) | (sharing[ranked] > 1)
    chosen: Blocks = order[~spared]
    return chosen


def _useful_points(core: Core, walk: Walk, cut: int, points: Blocks, p_pos: Index, blocks: Blocks) -> Blocks:
    """Of the points planned up to `cut`, those whose drop helps: each dropped a reference to an object the
    plan frees by `cut`, or is the point of a block the plan drops.  A point whose pages stay held (a running
    request's window, another point's) frees nothing and is kept."""
    freed = [o[at <= cut] for o, at in walk.freed_objects]
    gone = np.unique(np.concatenate(freed)) if freed else np.zeros(0, np.intp)
    helping = [at[np.isin(o, gone)] for o, at in walk.dropped_refs]
    useful = np.isin(p_pos, np.concatenate(helping)) if helping else np.zeros(len(p_pos), np.bool_)
    table = core.index.blocks.point
    useful |= np.isin(points, table[blocks][table[blocks] != NO_POINT])
    kept: Blocks = points[useful]
    return kept


def _apply(core: Core, walk: Walk, cut: int | None, max_units: int | None, frees_only: bool = False) -> int:
    """Drop the planned units up to position `cut` (None: all, or the first `max_units`); returns units.
    `frees_only`: of the points, only those whose drop frees something the plan frees (`_useful_points`)."""
    points, p_pos = np.concatenate(walk.points), np.concatenate(walk.point_pos)
    blocks, b_pos = np.concatenate(walk.blocks), np.concatenate(walk.block_pos)
    if max_units is not None:
        order = np.sort(np.concatenate([p_pos, b_pos]))
        cut = int(order[max_units - 1]) if 0 < max_units <= len(order) else (-1 if not max_units else None)
    if cut is not None:
        points, p_pos, blocks = points[p_pos <= cut], p_pos[p_pos <= cut], blocks[b_pos <= cut]
        if frees_only:
            points = _useful_points(core, walk, cut, points, p_pos, blocks)
    core.index.drop_points(points.astype(np.intp))
    core.index.drop_blocks(blocks.astype(np.intp))
    core.objects.settle(core.index.take_unheld())
    core.stats["evicted_points"] += len(points)
    core.stats["evicted_blocks"] += len(blocks)
    core.stats["evictions"] += 1
    return len(points) + len(blocks)


def resources(core: Core) -> int:
    """Resources eviction frees: each page pool's objects, each shared space's pages, block rows, point rows."""
    return len(core.pools) + len(core.objects.spaces) + 2


def _needs(core: Core, pages: list[int], blocks: int, points: int, slack: bool) -> list[int]:
    """What must be freed per resource (page pools, shared spaces, block rows, point rows), with the low-water
    margin on each resource that is short."""
    shift = core.config.evict_slack_shift
    spaces = core.objects.spaces
    frees = ([p.own_free for p in core.pools] + [s.count for s in spaces]
             + [core.index.blocks.available(), core.index.points.available()])
    sizes = ([p.size for p in core.pools] + [s.slots - 1 for s in spaces]
             + [core.index.blocks.capacity, core.index.points.capacity])
    out = []
    wanted = [*pages, *(sum(pages) for _ in spaces), blocks, points]
    for need, free, size in zip(wanted, frees, sizes, strict=True):
        short = need - free
        out.append(short + (size >> shift if slack and shift is not None else 0) if short > 0 else 0)
    return out


def evict_for(core: Core, pages: list[int], blocks: int, points: int) -> list[int] | None:
    """Evict enough for an allocation's needs (and a margin); None when done.  When impossible, nothing is
    evicted and the result says what eviction could free per resource (page pools, block rows, point rows)."""
    wanted, required = _needs(core, pages, blocks, points, True), _needs(core, pages, blocks, points, False)
    walk = _walk(core, wanted, None)
    cut = _cut(walk, wanted)
    if cut is None:
        cut = _cut(walk, required)
        if cut is None:  # the walk planned every unit in the order: what each resource could get
            return [sum(len(p) for p in positions) for positions in walk.freed]
    _apply(core, walk, cut, None, frees_only=wanted[-1] <= 0 and required[-1] <= 0)  # unless rows are short
    return None


def evict_all(core: Core, max_units: int | None = None) -> int:
    """Evict unpinned units in the policy's order as it is, then the points behind running requests (all of
    them, or the first `max_units`: a point and its leaf block together, deepest first, never leaving a chain
    of blocks behind without the points they lead to; the passes that choose what requests resume at are for
    an allocation's need)."""
    walk = _walk(core, [0] * resources(core), max_units, (Pass(), Pass(points_only=True, running=True)))
    if not walk.units:
        return 0
    return _apply(core, walk, None, max_units)
