"""Device-tier eviction: LRU over unpinned units, dependency aware (FAILURES.md F9).

Units are resume points (their tail snapshots and their references on window
pages) and leaf blocks (their prefix-page references).  A block is only
evicted as a leaf, so the tail of a chain goes before its head and no retained
resume point ever loses a page it needs: the point is dropped first, and a
window page is retired only when no point references it.

Eviction for an allocation is planned first on a virtual copy of the
reference counts; it is carried out only if it frees enough pages in every
pool the allocation needs, so a failed allocation evicts nothing (F8).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable

import attrs
import numpy as np

from hkv_core.manager.core import Core
from hkv_core.manager.pools import NULL_PAGE, PoolRole

Ref = tuple[int, int]  # (pool, page)


@attrs.define
class Virtual:
    """Reference drops and block removals not yet applied to the manager."""

    refs: Counter[Ref] = attrs.field(factory=Counter)
    children: Counter[int] = attrs.field(factory=Counter)
    gone: set[int] = attrs.field(factory=set)
    no_point: set[int] = attrs.field(factory=set)
    freed: Counter[int] = attrs.field(factory=Counter)
    units: list[int] = attrs.field(factory=list)


def _pinned(core: Core, block: int) -> bool:
    a = core.arena
    for role, column in ((PoolRole.PREFIX, a.prefix_pages), (PoolRole.TAIL, a.tail_pages)):
        for col, pool in enumerate(core.by_role[role]):
            page = int(column[block, col])
            if page != NULL_PAGE and core.pools[pool].leases[page] > 0:
                return True
    return False


def candidates(core: Core) -> np.ndarray:
    """Units in LRU order (oldest first, deeper first on ties)."""
    a = core.arena
    ids = np.flatnonzero(a.alive & ((a.children == 0) | a.point))
    return ids[np.lexsort((-a.position[ids], a.last_access[ids]))]


def _point_refs(core: Core, block: int) -> list[tuple[Ref, str]]:
    a, refs = core.arena, []
    for col, pool in enumerate(core.by_role[PoolRole.TAIL]):
        refs.append(((pool, int(a.tail_pages[block, col])), "evict"))
    boundary = (int(a.position[block]) + 1) * core.block_tokens
    for col, pool in enumerate(core.by_role[PoolRole.WINDOW]):
        first, b = core.window_first_block(pool, boundary), block
        while b >= 0 and int(a.position[b]) >= first:
            refs.append(((pool, int(a.window_pages[b, col])), "retire"))
            b = int(a.parent[b])
    return [(r, e) for r, e in refs if r[1] != NULL_PAGE]


def _block_refs(core: Core, block: int) -> list[tuple[Ref, str]]:
    pages = core.arena.prefix_pages[block]
    return [((pool, int(pages[col])), "evict") for col, pool in enumerate(core.by_role[PoolRole.PREFIX])
            if pages[col] != NULL_PAGE]


def _unit(core: Core, v: Virtual, block: int) -> list[tuple[Ref, str]] | None:
    """The references a unit drops (and mark it in `v`), or None when it cannot go now."""
    a = core.arena
    if block in v.gone or _pinned(core, block):
        return None
    has_point = bool(a.point[block]) and block not in v.no_point
    leaf = int(a.children[block]) - v.children[block] == 0 and block not in core.chain_tails
    if not has_point and not leaf:
        return None
    refs = _point_refs(core, block) if has_point else []
    if has_point:
        v.no_point.add(block)
    if leaf:
        refs += _block_refs(core, block)
        v.gone.add(block)
        v.children[int(a.parent[block])] += 1
    v.units.append(block)
    return refs


def _count(core: Core, v: Virtual, refs: list[tuple[Ref, str]]) -> None:
    for (pool, page), _ in refs:
        v.refs[(pool, page)] += 1
        p = core.pools[pool]
        if v.refs[(pool, page)] == p.holders[page] and p.leases[page] == 0:
            v.freed[pool] += 1


def _walk(core: Core, v: Virtual, enough: Callable[[Virtual], bool]) -> None:
    """Plan units in exact LRU order until `enough(v)`; parents join as their children go."""
    a = core.arena
    heap = [(int(a.last_access[b]), -int(a.position[b]), b) for b in candidates(core).tolist()]
    heapq.heapify(heap)
    while heap and not enough(v):
        _, _, block = heapq.heappop(heap)
        refs = _unit(core, v, block)
        if refs is None:
            continue
        _count(core, v, refs)
        parent = int(a.parent[block])
        if block in v.gone and parent >= 0 and int(a.children[parent]) == v.children[parent]:
            heapq.heappush(heap, (int(a.last_access[parent]), -int(a.position[parent]), parent))


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
    """Carry out a planned eviction: drop points and blocks, then release pages in bulk per pool."""
    a, refs = core.arena, list[tuple[Ref, str]]()
    window_slots = list[tuple[int, int, int]]()  # (block, pool, page) whose window reference goes
    for block in v.units:
        if a.point[block]:
            refs += _point_refs(core, block)
            window_slots += _window_slots(core, block)
            a.point[block] = False
            a.tail_pages[block] = NULL_PAGE
            core.stats["evicted_points"] += 1
        if a.children[block] == 0 and block in v.gone:
            refs += _block_refs(core, block)
            key = a.key[block]
            assert core.keys.remove(int(key[0]), int(key[1])) == block
            a.drop(block)
            core.stats["evicted_blocks"] += 1
    freed = _release_refs(core, refs)
    for block, pool, page in window_slots:
        if (pool, page) in freed:
            a.window_pages[block, core.column[pool]] = NULL_PAGE


def _window_slots(core: Core, block: int) -> list[tuple[int, int, int]]:
    a, out = core.arena, []
    boundary = (int(a.position[block]) + 1) * core.block_tokens
    for col, pool in enumerate(core.by_role[PoolRole.WINDOW]):
        first, b = core.window_first_block(pool, boundary), block
        while b >= 0 and int(a.position[b]) >= first:
            out.append((b, pool, int(a.window_pages[b, col])))
            b = int(a.parent[b])
    return out


def _release_refs(core: Core, refs: list[tuple[Ref, str]]) -> set[Ref]:
    """Drop index references; pages whose last reference went are evicted (or retired). Returns them."""
    freed: set[Ref] = set()
    by_pool: dict[tuple[int, str], list[int]] = {}
    for (pool, page), event in refs:
        by_pool.setdefault((pool, event), []).append(page)
    for (pool, event), pages in by_pool.items():
        p, arr = core.pools[pool], np.array(pages, np.int32)
        np.subtract.at(p.holders, arr, 1)
        assert np.all(p.holders[arr] >= 0)
        gone = np.unique(arr[p.holders[arr] == 0])
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
