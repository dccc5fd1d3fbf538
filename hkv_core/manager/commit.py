"""Commit: tokens were written; publish complete pages, index blocks, keep resume points.

What commit publishes at length L is exactly what match may return at L
(FAILURES.md F7): blocks are indexed as soon as they are committed, a prefix
page is referenced from the index only once complete, and a resume point is
recorded only with all of its window pages and tail snapshots.  Every page
move is one bulk lifecycle step per pool.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.arena import NO_BLOCK
from hkv_core.manager.core import Core, RequestState, chain_tail
from hkv_core.manager.errors import InvalidRequestState
from hkv_core.manager.lease import pin
from hkv_core.manager.pools import NULL_PAGE, PoolRole

Pages = NDArray[np.int32]


def commit(core: Core, req: RequestState, num_tokens: int) -> None:
    if num_tokens < 1 or req.computed + num_tokens > req.allocated:
        raise InvalidRequestState(request_id=req.rid, action="commit",
                                  reason=f"{num_tokens} tokens from {req.computed} exceed the "
                                         f"{req.allocated} allocated")
    before = req.computed
    req.computed += num_tokens
    _complete_pages(core, req, before)
    _index_blocks(core, req)
    _publish_prefix(core, req)
    _record_points(core, req)
    _slide_windows(core, req)


def _owned_in_state(core: Core, req: RequestState, pool: int, pages: list[int], state: str) -> Pages:
    p = core.pools[pool]
    arr = np.array(pages, np.int32)
    if not arr.size:
        return arr
    arr = arr[arr != NULL_PAGE]
    return np.asarray(arr[(p.owner[arr] == req.rid) & (p.state[arr] == p.table.state_index[state])], np.int32)


def _complete_pages(core: Core, req: RequestState, before: int) -> None:
    """RESERVED -> READY for every owned page whose rows this commit finished writing."""
    for info in core.infos:
        table = req.tables[info.index]
        if info.role is PoolRole.PREFIX:
            tokens = info.spec.tokens_per_page
            complete = table[before // tokens:req.computed // tokens]
        elif info.role is PoolRole.WINDOW:
            complete = table[before // core.block_tokens:req.computed // core.block_tokens]
        else:
            col = core.by_role[PoolRole.TAIL].index(info.index)
            complete = [pages[col] for b, pages in req.snapshots.items() if b <= req.computed]
        core.pools[info.index].step(_owned_in_state(core, req, info.index, complete, "RESERVED"),
                                    "write_done", req.rid)


def _index_blocks(core: Core, req: RequestState) -> None:
    arena, start, blocks = core.arena, len(req.chain), req.computed // core.block_tokens
    tick = core.advance()
    if blocks > start:
        before = chain_tail(req)
        keys = req.keys[start:blocks]
        found = core.keys.lookup(keys)
        known = int(np.argmin(found >= 0)) if np.any(found < 0) else len(found)
        req.chain.extend(found[:known].tolist())
        if known < len(found):
            parent = req.chain[-1] if req.chain else NO_BLOCK
            ids = arena.add_chain(keys[known:], parent, start + known, tick)
            core.keys.insert_many(keys[known:], ids)
            req.chain.extend(ids.tolist())
        core.move_chain_tail(before, chain_tail(req))
    if blocks:
        arena.last_access[np.array(req.chain[:blocks], np.int32)] = tick


def _publish_prefix(core: Core, req: RequestState) -> None:
    """Reference each complete owned prefix page from the blocks that lack one; publish it if used."""
    for pool in core.by_role[PoolRole.PREFIX]:
        spec, col = core.infos[pool].spec, core.column[pool]
        per_page = spec.tokens_per_page // core.block_tokens
        table = req.tables[pool][:req.computed // spec.tokens_per_page]
        ready = _owned_in_state(core, req, pool, table, "READY")
        if not ready.size:
            continue
        index = {page: j for j, page in enumerate(table)}
        rows = np.array([index[p] for p in ready.tolist()], np.int64)[:, None] * per_page + np.arange(per_page)
        ids = np.array(req.chain, np.int32)[rows]
        empty = core.arena.prefix_pages[ids, col] == NULL_PAGE
        core.arena.prefix_pages[ids[empty], col] = np.broadcast_to(ready[:, None], ids.shape)[empty]
        counts = empty.sum(axis=1).astype(np.int32)
        core.pools[pool].holders[ready] += counts
        _publish_own(core, req, pool, ready[counts > 0])


def _publish_own(core: Core, req: RequestState, pool: int, pages: Pages) -> None:
    """READY -> PUBLISHED, then the request pins the pages it still reads."""
    if not pages.size:
        return
    core.pools[pool].step(pages, "publish", req.rid)
    req.owned[pool].difference_update(pages.tolist())
    pin(core, req, pool, pages)


def _record_points(core: Core, req: RequestState) -> None:
    """Index the resume points whose snapshots are due; a point already indexed keeps its own pages."""
    due = sorted(b for b in req.snapshots if b <= req.computed)
    if not due:
        return
    tails = core.by_role[PoolRole.TAIL]
    blocks = np.array([req.chain[b // core.block_tokens - 1] for b in due], np.int32)
    snaps = np.array([req.snapshots.pop(b) for b in due], np.int32).reshape(len(due), len(tails))
    fresh = ~core.arena.point[blocks] & _windows_publishable(core, req, due)
    for col, pool in enumerate(tails):
        core.pools[pool].step(snaps[~fresh, col], "abort", req.rid)
        core.pools[pool].step(snaps[fresh, col], "publish", req.rid)
        req.owned[pool].difference_update(snaps[:, col].tolist())
        core.arena.tail_pages[blocks[fresh], col] = snaps[fresh, col]
        np.add.at(core.pools[pool].holders, snaps[fresh, col], 1)
    for pool in core.by_role[PoolRole.WINDOW]:
        _hold_windows(core, req, pool, [b for b, f in zip(due, fresh.tolist(), strict=True) if f])
    core.arena.point[blocks[fresh]] = True


def _window_blocks(core: Core, pool: int, boundary: int) -> NDArray[np.int64]:
    return np.arange(core.window_first_block(pool, boundary), boundary // core.block_tokens)


def _windows_publishable(core: Core, req: RequestState, due: list[int]) -> NDArray[np.bool_]:
    """Per due point: every window page it would index is the request's own or still PUBLISHED.

    A window page the request pins can have been retired meanwhile (an evicted
    point held it); the index never references a retired page again, so such
    a point is not recorded (retention is best effort).
    """
    ok = np.ones(len(due), np.bool_)
    chain = np.array(req.chain, np.int32)
    for pool in core.by_role[PoolRole.WINDOW]:
        p, col, table = core.pools[pool], core.column[pool], np.array(req.tables[pool], np.int32)
        spans = [_window_blocks(core, pool, b) for b in due]
        ks = np.concatenate(spans)
        have, mine = core.arena.window_pages[chain[ks], col], table[ks]
        bad = (have == NULL_PAGE) & (mine != NULL_PAGE) & (p.state[mine] != p.published) & (p.owner[mine] != req.rid)
        point = np.repeat(np.arange(len(due)), [len(k) for k in spans])
        ok &= np.bincount(point[bad], minlength=len(due)) == 0
    return ok


def _hold_windows(core: Core, req: RequestState, pool: int, boundaries: list[int]) -> None:
    """Each new point holds one reference on every window page it needs."""
    if not boundaries:
        return
    col = core.column[pool]
    ks = np.concatenate([_window_blocks(core, pool, b) for b in boundaries])
    ids = np.array(req.chain, np.int32)[ks]
    have = core.arena.window_pages[ids, col]
    mine = np.array(req.tables[pool], np.int32)[ks]
    need = have == NULL_PAGE
    assert np.all(mine[need] != NULL_PAGE), "a recorded point's window page was released early"
    core.arena.window_pages[ids[need], col] = mine[need]
    pages = np.where(need, mine, have)
    np.add.at(core.pools[pool].holders, pages, 1)
    _publish_own(core, req, pool, _owned_in_state(core, req, pool, np.unique(pages).tolist(), "READY"))


def _slide_windows(core: Core, req: RequestState) -> None:
    """Drop the request's window pages that neither its own window nor a pending point needs."""
    pending = [b for b in req.snapshots if b > req.computed]
    for pool in core.by_role[PoolRole.WINDOW]:
        keep_from = min([core.window_first_block(pool, req.computed)]
                        + [core.window_first_block(pool, b) for b in pending])
        table, owned = req.tables[pool], req.owned[pool]
        floor = req.window_floor.get(pool, 0)
        gone = [k for k in range(floor, min(keep_from, len(table))) if table[k] != NULL_PAGE]
        req.window_floor[pool] = max(floor, min(keep_from, len(table)))
        aborts = np.array([table[k] for k in gone if table[k] in owned], np.int32)
        unpins = np.array([table[k] for k in gone if table[k] not in owned], np.int32)
        core.pools[pool].step(aborts, "abort", req.rid)
        owned.difference_update(aborts.tolist())
        unpin(core, req, pool, unpins)
        for k in gone:
            table[k] = NULL_PAGE


def unpin(core: Core, req: RequestState, pool: int, pages: Pages) -> None:
    """Drop the request's pins on `pages`; reclaim retired pages nobody holds any more."""
    if not pages.size:
        return
    core.pools[pool].step(pages, "unpin", req.rid, leased_by_actor=True)
    pins = req.pinned_versions[pool]
    for page in pages.tolist():
        del pins[page]
    reclaim_retired(core, pool, pages)


def reclaim_retired(core: Core, pool: int, pages: Pages) -> None:
    p = core.pools[pool]
    if "RETIRED" not in p.table.state_index:
        return
    retired = pages[(p.state[pages] == p.table.state_index["RETIRED"]) & (p.leases[pages] == 0)]
    p.step(np.unique(retired), "reclaim")
