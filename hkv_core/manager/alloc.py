"""Allocate: pages and slot mappings for a request's next tokens, all or nothing.

Pages are counted first; if a pool is short the manager evicts (LRU,
dependency aware) rather than growing; if still short, OutOfPages is raised
and nothing about the request changed (FAILURES.md F8).
"""

from __future__ import annotations

import bisect

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.core import Core, RequestState
from hkv_core.manager.errors import InvalidRequestState, OutOfPages
from hkv_core.manager.evict import evict_for
from hkv_core.manager.pools import NULL_PAGE, PoolRole
from hkv_core.manager.records import Allocation, CopyPages
from hkv_core.units import tail_rows


def retained(core: Core, req: RequestState, boundary: int) -> bool:
    """The retention policy: is a resume point kept at this block boundary?"""
    if not core.needs_points() or boundary <= 0 or boundary % core.block_tokens:
        return False
    if (boundary // core.block_tokens) % core.config.retain_every_blocks == 0:
        return True
    end = req.prompt_tokens // core.block_tokens * core.block_tokens
    return core.config.retain_prompt_end and boundary == end


def retained_between(core: Core, req: RequestState, start: int, end: int) -> list[int]:
    """Every retained boundary b with start < b <= end, ascending (`retained` over the range, in O(points))."""
    if not core.needs_points():
        return []
    every = core.block_tokens * core.config.retain_every_blocks
    out = list(range(start // every * every + every, end + 1, every))
    prompt_end = req.prompt_tokens // core.block_tokens * core.block_tokens
    if core.config.retain_prompt_end and start < prompt_end <= end and prompt_end % every:
        bisect.insort(out, prompt_end)
    return out


def _prefix_needs(core: Core, req: RequestState, pool: int, start: int, end: int) -> tuple[int, int | None]:
    """(new pages, page index needing copy-on-write or None) for tokens [start, end)."""
    tokens = core.infos[pool].spec.tokens_per_page
    first, last = start // tokens, (end - 1) // tokens
    table = req.tables[pool]
    cow = first if first < len(table) and table[first] not in req.owned[pool] else None
    return (last + 1 - len(table)) + (cow is not None), cow


def _needs(core: Core, req: RequestState, start: int, end: int) -> tuple[dict[int, int], dict[int, int], list[int]]:
    counts, cows = {}, {}
    boundaries = retained_between(core, req, start, end)
    for info in core.infos:
        if info.role is PoolRole.PREFIX:
            counts[info.index], cow = _prefix_needs(core, req, info.index, start, end)
            if cow is not None:
                cows[info.index] = cow
        elif info.role is PoolRole.WINDOW:
            counts[info.index] = (end - 1) // core.block_tokens + 1 - len(req.tables[info.index])
        else:
            counts[info.index] = (not req.tables[info.index]) + len(boundaries)
    return counts, cows, boundaries


def allocate(core: Core, req: RequestState, num_tokens: int) -> Allocation:
    """Pages for tokens [allocated, allocated + n); a request that never acquired starts at 0."""
    start, end = req.allocated, req.allocated + num_tokens
    if num_tokens < 1 or end > len(req.tokens):
        raise InvalidRequestState(request_id=req.rid, action="allocate",
                                  reason=f"{num_tokens} tokens from {start} exceed the {len(req.tokens)} known")
    counts, cows, boundaries = _needs(core, req, start, end)
    if not evict_for(core, counts):
        pool = next(p for p, n in counts.items() if len(core.pools[p].free) < n)
        raise OutOfPages(pool=core.infos[pool].name, needed=counts[pool], free=len(core.pools[pool].free))
    copies = []
    snapshots: dict[int, dict[str, int]] = {b: {} for b in boundaries}
    for pool, count in counts.items():
        pages = core.pools[pool].take(count, req.rid).tolist()
        req.owned[pool].update(pages)
        copies += _place(core, req, pool, pages, cows.get(pool), boundaries, snapshots)
    for b in boundaries:
        req.snapshots[b] = [snapshots[b][core.infos[p].name] for p in core.by_role[PoolRole.TAIL]]
    req.allocated, req.acquired = end, True
    core.stats["copies"] += len(copies)
    tables = {i.index: req.tables[i.index].view().copy() for i in core.infos if i.role is not PoolRole.TAIL}
    return Allocation(request_id=req.rid, start_tokens=start, num_tokens=num_tokens,
                      block_tables={core.infos[p].name: t for p, t in tables.items()},
                      slots={core.infos[p].name: _slots(core, p, t, start, end) for p, t in tables.items()},
                      tail_pages={core.infos[p].name: req.tables[p][0] for p in core.by_role[PoolRole.TAIL]},
                      snapshots=snapshots, copies=tuple(copies))


def _place(core: Core, req: RequestState, pool: int, pages: list[int], cow: int | None,
           boundaries: list[int], snapshots: dict[int, dict[str, int]]) -> list[CopyPages]:
    info, table, copies = core.infos[pool], req.tables[pool], []
    if info.role is PoolRole.TAIL:
        if not table:
            table.append(pages.pop(0))
            copies += _tail_copy(core, req, pool, table[0])
        for b, page in zip(boundaries, pages, strict=True):
            snapshots[b][info.name] = page
        return copies
    if cow is not None:
        src, dst = table[cow], pages.pop(0)
        entries = (req.hit_tokens - cow * info.spec.tokens_per_page) // max(1, info.spec.compress_ratio)
        copies.append(CopyPages(pool=info.name, src=src, dst=dst, entries=entries,
                                src_version=req.pinned_versions[pool][src]))
        table[cow] = dst
    table.extend(pages)
    return copies


def _tail_copy(core: Core, req: RequestState, pool: int, working: int) -> list[CopyPages]:
    """Seed the working tail page from the hit's snapshot (nothing to copy when it has no rows)."""
    rows = tail_rows(req.hit_tokens, core.infos[pool].spec.compress_ratio) if req.hit_tokens else 0
    if not rows:
        return []
    src = int(req.hit_pages[pool][0])
    return [CopyPages(pool=core.infos[pool].name, src=src, dst=working, entries=rows,
                      src_version=req.pinned_versions[pool][src])]


def _slots(core: Core, pool: int, table: NDArray[np.int32], start: int, end: int) -> NDArray[np.int64]:
    """Flat slots of the entries tokens [start, end) produce in `pool`, whose page table is `table`."""
    info = core.infos[pool]
    per_page, ratio = info.spec.entries_per_page, max(1, info.spec.compress_ratio)
    if info.role is PoolRole.WINDOW:
        entries = np.arange(start, end)
    else:
        entries = np.arange((start + ratio) // ratio - 1, end // ratio)
    pages = table[entries // per_page].astype(np.int64)
    assert not np.count_nonzero(pages == NULL_PAGE), "a slot never points at the NULL page"
    return pages * per_page + entries % per_page
