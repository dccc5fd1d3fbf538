"""Acquire: re-check a hit's page versions, then pin every page it reads (all or nothing)."""

from __future__ import annotations

import numpy as np

from hkv_core.manager.core import Core, RequestState
from hkv_core.manager.errors import StaleLease, stale_block
from hkv_core.manager.id_list import IdList
from hkv_core.manager.pools import NULL_PAGE, Index, Pages, PoolRole
from hkv_core.manager.records import Hit


def verify(core: Core, req: RequestState, hit: Hit) -> dict[int, Index]:
    """StaleLease unless every page of the hit still has the version and state the hit checked.

    Returns the hit's pages per pool as NumPy indices (what `acquire` pins).
    """
    out = {}
    for name, pages in hit.pages.items():
        pool = core.pools[core.pool_index[name]]
        index = pages.astype(np.intp)
        now = pool.version[index]
        moved = (now != hit.versions[name]) | (pool.state[index] != pool.published)
        if np.count_nonzero(moved):
            i = int(np.flatnonzero(moved)[0])
            raise StaleLease(pool=name, page=int(pages[i]), expected_version=int(hit.versions[name][i]),
                             found_version=int(now[i]), request_id=req.rid,
                             found_state=pool.state_name(int(pages[i])))
        out[core.pool_index[name]] = index
    _check_blocks(core, req, hit)
    return out


def _check_blocks(core: Core, req: RequestState, hit: Hit) -> None:
    """StaleLease unless every block of the hit is still indexed under its key, with its resume point.

    Pages shared with earlier blocks can keep their versions when a hit's
    last blocks are evicted; the request's chain must never name a dropped
    (possibly recycled) block.
    """
    ids, a = hit.block_ids, core.arena
    if not len(ids):
        return
    gone = ~a.alive[ids] | np.any(a.key[ids] != req.keys[:len(ids)], axis=1)
    if np.count_nonzero(gone):
        raise stale_block(block=int(ids[np.flatnonzero(gone)[0]]), request_id=req.rid, point=False)
    if core.needs_points() and not a.point[ids[-1]]:
        raise stale_block(block=int(ids[-1]), request_id=req.rid, point=True)


def pin(core: Core, req: RequestState, pool: int, pages: Pages | Index) -> None:
    """Pin distinct `pages` of `pool` for the request (pages it already pins are skipped)."""
    pins, listed = req.pinned_versions[pool], pages.tolist()
    if pins and not pins.keys().isdisjoint(listed):
        fresh = np.array([p not in pins for p in listed], np.bool_)
        pages, listed = pages[fresh], [p for p in listed if p not in pins]
    p = core.pools[pool]
    index = pages.astype(np.intp, copy=False)
    p.step(index, "pin", req.rid)
    pins.update(zip(listed, p.version[index].tolist(), strict=True))


def acquire(core: Core, req: RequestState, hit: Hit) -> None:
    """Pin the hit for the request and seed its page tables from it."""
    for pool, pages in verify(core, req, hit).items():
        pin(core, req, pool, pages)
    blocks = len(hit.block_ids)
    req.chain = IdList(hit.block_ids)
    req.computed = req.allocated = req.hit_tokens = hit.tokens
    req.hit_pages = {core.pool_index[n]: p.copy() for n, p in hit.pages.items()}
    core.arena.touch(hit.block_ids)
    for info in core.infos:
        got = hit.pages.get(info.name, np.zeros(0, np.int32))
        if info.role is PoolRole.PREFIX:
            req.tables[info.index] = IdList(got)
        elif info.role is PoolRole.WINDOW:
            first = core.window_first_block(info.index, hit.tokens)
            req.tables[info.index] = IdList(np.concatenate([np.full(first, NULL_PAGE, np.int32), got]))
            assert len(req.tables[info.index]) == blocks or not blocks
    req.acquired = True
