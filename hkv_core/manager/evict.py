"""Device-tier eviction: LRU over unpinned units, dependency aware (FAILURES.md F9).

Units are resume points (their tail snapshots and their references on window
pages) and leaf blocks (their prefix-page references).  A block is only
evicted as a leaf, and never while it ends a live request's chain, so the tail
of a chain goes before its head, no request's chain loses a block, and no
retained resume point ever loses a page it needs: the point is dropped first,
and a window page is retired only when no point references it.  The order
comes from the arena's LRU queue, consumed lazily (no sort per eviction).

Eviction for an allocation is planned first on a virtual copy of the
reference counts; it is carried out only if it frees enough pages in every
pool the allocation needs, so a failed allocation evicts nothing (F8).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.core import Core
from hkv_core.manager.pools import NULL_PAGE, PoolRole, add_counts

Ref = tuple[int, int]  # (pool, page)
Slot = tuple[int, int, int]  # (block, window pool, page): a window reference kept in the arena
PointDrops = tuple[list[tuple[Ref, str]], list[Slot]]
Pages = NDArray[np.int32]
QUEUE_CHUNK = 256  # LRU queue entries screened by the first NumPy step of a walk (doubling after)
MAX_QUEUE_CHUNK = 65_536


@attrs.define
class Virtual:
    """Reference drops and block removals not yet applied to the manager."""

    refs: Counter[Ref] = attrs.field(factory=Counter)
    children: Counter[int] = attrs.field(factory=Counter)
    gone: set[int] = attrs.field(factory=set)
    freed: Counter[int] = attrs.field(factory=Counter)
    units: list[int] = attrs.field(factory=list)
    points: dict[int, PointDrops] = attrs.field(factory=dict)  # planned points: what each one drops
    tails: set[int] = attrs.field(factory=set)  # the last block of every live request's chain: never dropped


def live_chain_tails(core: Core) -> set[int]:
    """Blocks that end a live request's chain; as only leaves go, keeping them keeps every chain indexed (F11)."""
    return {req.chain[-1] for req in core.requests.values() if req.chain}


def _pinned_mask(core: Core, blocks: NDArray[np.int32]) -> NDArray[np.bool_]:
    """Per block: does a lease pin one of its prefix pages or its tail snapshots?"""
    a, pinned = core.arena, np.zeros(len(blocks), np.bool_)
    for role, column in ((PoolRole.PREFIX, a.prefix_pages), (PoolRole.TAIL, a.tail_pages)):
        for col, pool in enumerate(core.by_role[role]):
            pinned |= core.pools[pool].leases[column[blocks, col]] > 0  # the NULL page is never pinned
    return pinned


def _point_drops(core: Core, block: int) -> PointDrops:
    """A resume point's references (tail snapshots, window pages of its window) and its window slots."""
    a = core.arena
    refs = [((pool, page), "evict") for pool, page in zip(core.by_role[PoolRole.TAIL], a.tail_pages[block].tolist(),
                                                           strict=True) if page != NULL_PAGE]
    windows, slots = core.by_role[PoolRole.WINDOW], list[Slot]()
    if not windows:
        return refs, slots
    position = int(a.position[block])
    firsts = [core.window_first_block(pool, (position + 1) * core.block_tokens) for pool in windows]
    chain = [block]
    for _ in range(position - min(firsts)):  # the block and its ancestors back to the widest window
        chain.append(int(a.parent[chain[-1]]))
    rows = a.window_pages[chain].tolist()
    for col, (pool, first) in enumerate(zip(windows, firsts, strict=True)):
        for k in range(position + 1 - first):
            if rows[k][col] != NULL_PAGE:
                refs.append(((pool, rows[k][col]), "retire"))
                slots.append((chain[k], pool, rows[k][col]))
    return refs, slots


@attrs.frozen
class Chunk:
    """Columns of the unpinned current blocks of one queue chunk, as Python lists (no NumPy scalars)."""

    blocks: list[int]
    point: list[bool]
    children: list[int]
    parent: list[int]
    prefix: list[tuple[int, list[int], list[int], list[bool]]]  # (pool, page, its holders, unleased) per block

    @classmethod
    def read(cls, core: Core, blocks: NDArray[np.int32]) -> Chunk:
        a, prefix = core.arena, []
        for col, pool in enumerate(core.by_role[PoolRole.PREFIX]):
            pages, p = a.prefix_pages[blocks, col], core.pools[pool]
            prefix.append((pool, pages.tolist(), p.holders[pages].tolist(), (p.leases[pages] == 0).tolist()))
        return cls(blocks.tolist(), a.point[blocks].tolist(), a.children[blocks].tolist(),
                   a.parent[blocks].tolist(), prefix)


def _unit(core: Core, v: Virtual, chunk: Chunk, i: int) -> bool:
    """Plan the i-th block of the chunk as a unit if it can go now: its point, and the block if a leaf.

    A block goes only as a leaf (every child already gone) that ends no live
    request's chain; its resume point can go on its own.
    """
    block, has_point = chunk.blocks[i], chunk.point[i]
    leaf = chunk.children[i] == v.children[block] and block not in v.tails
    if not has_point and not leaf:
        return False
    if has_point:
        v.points[block] = _point_drops(core, block)
        _count(core, v, v.points[block][0])
    if leaf:
        for pool, pages, holders, unleased in chunk.prefix:
            if pages[i] != NULL_PAGE:
                count = v.refs[(pool, pages[i])] = v.refs[(pool, pages[i])] + 1
                v.freed[pool] += count == holders[i] and unleased[i]
        v.gone.add(block)
        v.children[chunk.parent[i]] += 1
    v.units.append(block)
    return True


def _count(core: Core, v: Virtual, refs: list[tuple[Ref, str]]) -> None:
    for (pool, page), _ in refs:
        v.refs[(pool, page)] += 1
        p = core.pools[pool]
        if v.refs[(pool, page)] == p.holders[page] and p.leases[page] == 0:
            v.freed[pool] += 1


def _walk(core: Core, v: Virtual, enough: Callable[[Virtual], bool]) -> None:
    """Plan units in exact LRU order until `enough(v)`, reading the arena's LRU queue in chunks.

    The queue is ordered by last use, deeper first, and every child's entry
    comes before its parent's (blocks of live chains excepted: they never go),
    so by the time a block is reached it is a leaf if it ever will be.
    """
    a, start, chunk_entries = core.arena, core.arena.lru_head, QUEUE_CHUNK
    v.tails = live_chain_tails(core)
    leading_stale = True
    while start < a.lru_len and not enough(v):
        end = min(start + chunk_entries, a.lru_len)
        chunk_entries = min(2 * chunk_entries, MAX_QUEUE_CHUNK)  # long live chains at the front: O(log) rounds
        current = a.current(start, end)
        if leading_stale:
            first = int(np.argmax(current)) if current.any() else end - start
            a.lru_head, leading_stale = start + first, first == end - start
        blocks = a.lru_block[start:end][current]
        chunk = Chunk.read(core, blocks[~_pinned_mask(core, blocks)])
        for i in range(len(chunk.blocks)):
            if _unit(core, v, chunk, i) and enough(v):
                return
        start = end


def plan(core: Core, needs: dict[int, int]) -> Virtual | None:
    """LRU units whose eviction frees `needs[pool]` pages in every pool, or None if impossible."""
    v = Virtual()
    short = {p: n - len(core.pools[p].free) for p, n in needs.items() if n > len(core.pools[p].free)}

    def enough(v: Virtual) -> bool:
        return all(v.freed[p] >= n for p, n in short.items())

    if short:
        _walk(core, v, enough)
    return v if enough(v) else None


def apply(core: Core, v: Virtual) -> None:
    """Carry out a planned eviction: drop points, then blocks, then release pages in bulk per pool."""
    a = core.arena
    points = np.array(list(v.points), np.int32)
    slots = [s for _, point_slots in v.points.values() for s in point_slots]
    point_pages: dict[tuple[int, str], list[int]] = {}
    for (pool, page), event in (r for refs, _ in v.points.values() for r in refs):
        point_pages.setdefault((pool, event), []).append(page)
    drops = {key: [np.array(pages, np.int32)] for key, pages in point_pages.items()}
    a.point[points] = False
    a.tail_pages[points] = NULL_PAGE
    gone = np.array([b for b in v.units if b in v.gone], np.int32)
    for col, pool in enumerate(core.by_role[PoolRole.PREFIX]):
        pages = a.prefix_pages[gone, col]
        drops.setdefault((pool, "evict"), []).append(pages[pages != NULL_PAGE])
    core.keys.remove_ids(gone)  # before drop_many recycles their arena rows (the table reads keys there)
    a.drop_many(gone)
    core.stats["evicted_points"] += len(points)
    core.stats["evicted_blocks"] += len(gone)
    freed = _release_refs(core, {k: np.concatenate(v) for k, v in drops.items()})
    for block, pool, page in slots:
        if (pool, page) in freed:
            a.window_pages[block, core.column[pool]] = NULL_PAGE


def _release_refs(core: Core, drops: dict[tuple[int, str], Pages]) -> set[Ref]:
    """Drop index references; pages whose last reference went are evicted (or retired). Returns them."""
    freed: set[Ref] = set()
    for (pool, event), pages in drops.items():
        if not pages.size:
            continue
        p = core.pools[pool]
        add_counts(p.holders, pages, -1)
        assert np.all(p.holders[pages] >= 0)
        gone = np.unique(pages[p.holders[pages] == 0])
        p.step(gone, event)
        if event == "retire":
            p.step(gone[p.leases[gone] == 0], "reclaim")
        freed.update((pool, page) for page in gone.tolist())
    return freed


def evict_for(core: Core, needs: dict[int, int]) -> bool:
    """Evict just enough for `needs`; False (and nothing evicted) when that is impossible."""
    v = plan(core, needs)
    if v is None:
        return False
    apply(core, v)
    return True


def evict_all(core: Core, max_units: int | None = None) -> int:
    """Evict unpinned units in exact LRU order (all of them, or the first `max_units`)."""
    v = Virtual()
    _walk(core, v, lambda v: max_units is not None and len(v.units) >= max_units)
    apply(core, v)
    return len(v.units)
