"""Device-tier eviction: LRU over unpinned units, dependency aware (FAILURES.md F9).

Units are resume points (their tail snapshots and their references on window
pages) and leaf blocks (their prefix-page references).  A block is only
evicted as a leaf, so the tail of a chain goes before its head and no retained
resume point ever loses a page it needs: the point is dropped first, and a
window page is retired only when no point references it.
"""

from __future__ import annotations

import numpy as np

from hkv_core.manager.core import Core
from hkv_core.manager.pools import NULL_PAGE, PoolRole

BATCH_UNITS = 64


def _pinned(core: Core, block: int) -> bool:
    a = core.arena
    for role, column in ((PoolRole.PREFIX, a.prefix_pages), (PoolRole.TAIL, a.tail_pages)):
        for col, pool in enumerate(core.by_role[role]):
            page = int(column[block, col])
            if page != NULL_PAGE and core.pools[pool].leases[page] > 0:
                return True
    return False


def candidates(core: Core) -> np.ndarray:
    """Evictable units in LRU order (oldest first, deeper first on ties)."""
    a = core.arena
    ids = np.flatnonzero(a.alive & ((a.children == 0) | a.point))
    order = np.lexsort((-a.position[ids], a.last_access[ids]))
    return ids[order]


def evict_unit(core: Core, block: int) -> bool:
    """Evict a point (and the block itself when it is a leaf); False if pinned."""
    if _pinned(core, block):
        return False
    if core.arena.point[block]:
        drop_point(core, block)
    if core.arena.children[block] == 0:
        drop_block(core, block)
    return True


def drop_point(core: Core, block: int) -> None:
    a = core.arena
    for col, pool in enumerate(core.by_role[PoolRole.TAIL]):
        page = int(a.tail_pages[block, col])
        a.tail_pages[block, col] = NULL_PAGE
        _release_ref(core, pool, page, "evict")
    boundary = (int(a.position[block]) + 1) * core.block_tokens
    chain = _ancestors(core, block, boundary // core.block_tokens - core.widest_window_first_block(boundary))
    for col, pool in enumerate(core.by_role[PoolRole.WINDOW]):
        first = core.window_first_block(pool, boundary)
        for b in chain:
            if int(a.position[b]) >= first:
                page = int(a.window_pages[b, col])
                if _release_ref(core, pool, page, "retire"):
                    a.window_pages[b, col] = NULL_PAGE
    a.point[block] = False
    core.stats["evicted_points"] += 1


def drop_block(core: Core, block: int) -> None:
    a = core.arena
    for col, pool in enumerate(core.by_role[PoolRole.PREFIX]):
        _release_ref(core, pool, int(a.prefix_pages[block, col]), "evict")
    key = a.key[block]
    assert core.keys.remove(int(key[0]), int(key[1])) == block
    a.drop(block)
    core.stats["evicted_blocks"] += 1


def _release_ref(core: Core, pool: int, page: int, event: str) -> bool:
    """Drop one index reference; free (or retire) the page when it was the last. True if freed."""
    if page == NULL_PAGE:
        return False
    p = core.pools[pool]
    p.holders[page] -= 1
    assert p.holders[page] >= 0
    if p.holders[page]:
        return False
    pages = np.array([page], np.int32)
    p.step(pages, event)
    if event == "retire" and p.leases[page] == 0:
        p.step(pages, "reclaim")
    return True


def _ancestors(core: Core, block: int, count: int) -> list[int]:
    chain, b = list[int](), block
    while b >= 0 and len(chain) < count:
        chain.append(b)
        b = int(core.arena.parent[b])
    return chain


def evict_for(core: Core, pool: int, needed: int) -> int:
    """Evict LRU units until `pool` has `needed` free pages or nothing more can go."""
    evicted = 0
    while len(core.pools[pool].free) < needed:
        progress = False
        for block in candidates(core)[:BATCH_UNITS].tolist():
            if core.arena.alive[block] and evict_unit(core, block):
                evicted, progress = evicted + 1, True
                if len(core.pools[pool].free) >= needed:
                    break
        if not progress:
            break
    return evicted


def evict_all(core: Core, max_units: int | None = None) -> int:
    """Evict every unpinned unit (or up to `max_units`)."""
    evicted = 0
    while max_units is None or evicted < max_units:
        progress = False
        for block in candidates(core).tolist():
            if max_units is not None and evicted >= max_units:
                break
            if core.arena.alive[block] and evict_unit(core, block):
                evicted, progress = evicted + 1, True
        if not progress:
            break
    return evicted
