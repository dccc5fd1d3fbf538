"""Commit: tokens were written; publish complete pages, index blocks, keep resume points.

What commit publishes at length L is exactly what match may return at L
(FAILURES.md F7): blocks are indexed as soon as they are committed, a prefix
page is referenced from the index only once complete, and a resume point is
recorded only with all of its window pages and tail snapshots.
"""

from __future__ import annotations

import numpy as np

from hkv_core.manager.arena import NO_BLOCK
from hkv_core.manager.core import Core, RequestState
from hkv_core.manager.errors import InvalidRequestState
from hkv_core.manager.lease import pin
from hkv_core.manager.pools import NULL_PAGE, PoolRole


def commit(core: Core, req: RequestState, num_tokens: int) -> None:
    if num_tokens < 1 or req.computed + num_tokens > req.allocated:
        raise InvalidRequestState(request_id=req.rid, action="commit",
                                  reason=f"{num_tokens} tokens from {req.computed} exceed the "
                                         f"{req.allocated} allocated")
    req.computed += num_tokens
    _complete_pages(core, req)
    _index_blocks(core, req)
    _publish_prefix(core, req)
    _record_points(core, req)
    _slide_windows(core, req)


def _complete_pages(core: Core, req: RequestState) -> None:
    """RESERVED -> READY for every owned page whose rows are all written."""
    done_blocks = req.computed // core.block_tokens
    snapshot_pages = {p for b, pages in req.snapshots.items() if b <= req.computed for p in pages}
    for info in core.infos:
        pool, table = core.pools[info.index], req.tables[info.index]
        if info.role is PoolRole.PREFIX:
            complete = table[:req.computed // info.spec.tokens_per_page]
        elif info.role is PoolRole.WINDOW:
            complete = table[:done_blocks]
        else:
            complete = [p for p in snapshot_pages if p in req.owned[info.index]]
        ready = np.array([p for p in complete if p in req.owned[info.index]
                          and pool.state_name(p) == "RESERVED"], np.int32)
        pool.step(ready, "write_done", req.rid)


def _index_blocks(core: Core, req: RequestState) -> None:
    arena, blocks = core.arena, req.computed // core.block_tokens
    tick = core.advance()
    for k in range(len(req.chain), blocks):
        key = req.keys[k]
        found = int(core.keys.lookup(key[None, :])[0])
        if found < 0:
            parent = req.chain[-1] if req.chain else NO_BLOCK
            found = arena.add(key, parent, k, np.full(len(core.by_role[PoolRole.PREFIX]), NULL_PAGE, np.int32),
                              tick)
            core.keys.insert(int(key[0]), int(key[1]), found)
        req.chain.append(found)
    arena.last_access[req.chain[-blocks:] if blocks else []] = tick


def _publish_prefix(core: Core, req: RequestState) -> None:
    """Reference each complete owned prefix page from the blocks that lack one; publish it if used."""
    for pool in core.by_role[PoolRole.PREFIX]:
        per_page = core.infos[pool].spec.tokens_per_page // core.block_tokens
        col, table = core.column[pool], req.tables[pool]
        for j, page in enumerate(table[:req.computed // core.infos[pool].spec.tokens_per_page]):
            if page not in req.owned[pool]:
                continue
            ids = np.array(req.chain[j * per_page:(j + 1) * per_page], np.int32)
            empty = ids[core.arena.prefix_pages[ids, col] == NULL_PAGE]
            if empty.size:
                core.arena.prefix_pages[empty, col] = page
                core.pools[pool].holders[page] += empty.size
                _publish_own(core, req, pool, page)


def _publish_own(core: Core, req: RequestState, pool: int, page: int) -> None:
    """READY -> PUBLISHED, then the request pins the page it still reads."""
    pages = np.array([page], np.int32)
    core.pools[pool].step(pages, "publish", req.rid)
    req.owned[pool].discard(page)
    pin(core, req, pool, pages)


def _record_points(core: Core, req: RequestState) -> None:
    for boundary in sorted(b for b in req.snapshots if b <= req.computed):
        pages = req.snapshots.pop(boundary)
        block = req.chain[boundary // core.block_tokens - 1]
        tails = core.by_role[PoolRole.TAIL]
        if core.arena.point[block]:
            for pool, page in zip(tails, pages, strict=True):
                core.pools[pool].step(np.array([page], np.int32), "abort", req.rid)
                req.owned[pool].discard(page)
            continue
        for pool, page in zip(tails, pages, strict=True):
            core.pools[pool].step(np.array([page], np.int32), "publish", req.rid)
            req.owned[pool].discard(page)
            core.arena.tail_pages[block, core.column[pool]] = page
            core.pools[pool].holders[page] += 1
        for pool in core.by_role[PoolRole.WINDOW]:
            _hold_window(core, req, pool, boundary)
        core.arena.point[block] = True


def _hold_window(core: Core, req: RequestState, pool: int, boundary: int) -> None:
    """The point at `boundary` holds one reference on each window page it needs."""
    col = core.column[pool]
    for k in range(core.window_first_block(pool, boundary), boundary // core.block_tokens):
        block = req.chain[k]
        page = int(core.arena.window_pages[block, col])
        if page == NULL_PAGE:
            page = req.tables[pool][k]
            assert page != NULL_PAGE, "a recorded point's window page was released early"
            core.arena.window_pages[block, col] = page
            if page in req.owned[pool]:
                _publish_own(core, req, pool, page)
        core.pools[pool].holders[page] += 1


def _slide_windows(core: Core, req: RequestState) -> None:
    """Drop the request's window pages that neither its own window nor a pending point needs."""
    pending = [b for b in req.snapshots if b > req.computed]
    for pool in core.by_role[PoolRole.WINDOW]:
        keep_from = min([core.window_first_block(pool, req.computed)]
                        + [core.window_first_block(pool, b) for b in pending])
        table, owned = req.tables[pool], req.owned[pool]
        gone = [k for k in range(min(keep_from, len(table))) if table[k] != NULL_PAGE]
        aborts = np.array([table[k] for k in gone if table[k] in owned], np.int32)
        unpins = np.array([table[k] for k in gone if table[k] not in owned], np.int32)
        core.pools[pool].step(aborts, "abort", req.rid)
        owned.difference_update(aborts.tolist())
        unpin(core, req, pool, unpins)
        for k in gone:
            table[k] = NULL_PAGE


def unpin(core: Core, req: RequestState, pool: int, pages: np.ndarray) -> None:
    """Drop the request's pins on `pages`; reclaim retired pages nobody holds any more."""
    if not pages.size:
        return
    core.pools[pool].step(pages, "unpin", req.rid, leased_by_actor=True)
    for page in pages.tolist():
        del req.pinned_versions[pool][page]
    reclaim_retired(core, pool, pages)


def reclaim_retired(core: Core, pool: int, pages: np.ndarray) -> None:
    p = core.pools[pool]
    if "RETIRED" not in p.table.state_index:
        return
    retired = pages[(p.state[pages] == p.table.state_index["RETIRED"]) & (p.leases[pages] == 0)]
    p.step(np.unique(retired), "reclaim")
