"""Commit: tokens were written; publish complete pages, index blocks, keep resume points.

What commit publishes at length L is exactly what match may return at L
(FAILURES.md F7): blocks are indexed as soon as they are committed, a prefix
page is referenced from the index only once complete, and a resume point is
recorded only with all of its window pages and tail snapshots.  Every page
move is one bulk lifecycle step per pool; a page the request owns is one whose
pool records it as the owner (the slot_single_owner invariant), so ownership
is tested with arrays, not per-page set lookups.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.arena import NO_BLOCK
from hkv_core.manager.core import Core, RequestState
from hkv_core.manager.errors import InvalidRequestState
from hkv_core.manager.lease import pin
from hkv_core.manager.pools import NULL_PAGE, Index, PoolRole, add_counts

Pages = Index  # page ids as intp indices
Ints = NDArray[np.intp]
AnyIds = NDArray[np.signedinteger[Any]]  # int32 (chains, page tables) or intp


def commit(core: Core, req: RequestState, num_tokens: int) -> None:
    if num_tokens < 1 or req.computed + num_tokens > req.allocated:
        raise InvalidRequestState(request_id=req.rid, action="commit",
                                  reason=f"{num_tokens} tokens from {req.computed} exceed the "
                                         f"{req.allocated} allocated")
    before = req.computed
    req.computed += num_tokens
    _complete_pages(core, req, before)
    _index_blocks(core, req)
    chain = req.chain.view()
    _publish_prefix(core, req, chain, before)
    _record_points(core, req, chain)
    _slide_windows(core, req)


def _owned_mask(core: Core, req: RequestState, pool: int, pages: Pages, state: str) -> NDArray[np.bool_]:
    """Which of `pages` the request owns in `state` (the NULL page is never owned)."""
    p = core.pools[pool]
    # NumPy scalars on the right: comparing with a Python int costs a dtype resolution per call
    return np.asarray((p.owner[pages] == np.int32(req.rid)) & (p.state[pages] == np.uint8(p.table.state_index[state])))


def _owned_in_state(core: Core, req: RequestState, pool: int, pages: list[int] | AnyIds, state: str) -> Pages:
    arr = np.array(pages, np.intp)
    return arr[_owned_mask(core, req, pool, arr, state)] if arr.size else arr


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
            col = core.column[info.index]
            complete = np.array([pages[col] for b, pages in req.snapshots.items() if b <= req.computed], np.int32)
        if len(complete):
            core.pools[info.index].step(_owned_in_state(core, req, info.index, complete, "RESERVED"),
                                        "write_done", req.rid)


def _index_blocks(core: Core, req: RequestState) -> None:
    """Chain the request's newly complete blocks (found indexed or added); only they are touched here."""
    arena, start, blocks = core.arena, len(req.chain), req.computed // core.block_tokens
    if blocks > start:
        keys = req.keys[start:blocks]
        found = core.keys.lookup(keys)
        known = int(np.argmin(found >= 0)) if np.any(found < 0) else len(found)
        req.chain.extend(found[:known])
        if known < len(found):
            parent = req.chain[-1] if req.chain else NO_BLOCK
            ids = arena.add_chain(keys[known:], parent, start + known)
            core.keys.insert_many(keys[known:], ids)
            req.chain.extend(ids)
        arena.touch(req.chain[start:blocks])


def _publish_prefix(core: Core, req: RequestState, chain: AnyIds, before: int) -> None:
    """Reference each owned prefix page this commit completed from the blocks that lack one; publish it if used.

    Only pages completed now are looked at: a page none of whose blocks lacked
    one stays private (its blocks keep their pages while the request's chain
    holds them), so a later commit would find nothing to do for it.
    """
    for pool in core.by_role[PoolRole.PREFIX]:
        spec, col = core.infos[pool].spec, core.column[pool]
        per_page, first = spec.tokens_per_page // core.block_tokens, before // spec.tokens_per_page
        table = req.tables[pool][first:req.computed // spec.tokens_per_page].astype(np.intp)
        at = np.flatnonzero(_owned_mask(core, req, pool, table, "READY")) if table.size else table
        if not at.size:
            continue
        ready, at = table[at], at + first
        ids = chain[(at[:, None] * per_page + np.arange(per_page)).ravel()] if per_page > 1 else chain[at]
        column = core.arena.prefix_pages[:, col]  # a view: writes go to the arena
        empty = column[ids] == NULL_PAGE
        column[ids[empty]] = (np.repeat(ready, per_page) if per_page > 1 else ready)[empty]
        counts = empty.reshape(len(ready), per_page).sum(axis=1, dtype=np.int32)
        core.pools[pool].holders[ready] += counts
        _publish_own(core, req, pool, ready[counts > 0])


def _publish_own(core: Core, req: RequestState, pool: int, pages: Pages) -> None:
    """READY -> PUBLISHED, then the request pins the pages it still reads."""
    if not pages.size:
        return
    core.pools[pool].step(pages, "publish", req.rid)
    req.owned[pool].difference_update(pages.tolist())
    pin(core, req, pool, pages)


def _record_points(core: Core, req: RequestState, chain: AnyIds) -> None:
    """Index the resume points whose snapshots are due; a point already indexed keeps its own pages."""
    due = sorted(b for b in req.snapshots if b <= req.computed)
    if not due:
        return
    tails = core.by_role[PoolRole.TAIL]
    blocks = chain[np.array(due, np.intp) // core.block_tokens - 1]
    snaps = np.array([req.snapshots.pop(b) for b in due], np.intp).reshape(len(due), len(tails))
    spans = {pool: _window_spans(core, pool, due) for pool in core.by_role[PoolRole.WINDOW]}
    tables = {pool: req.tables[pool].view() for pool in spans}
    fresh = ~core.arena.point[blocks] & _windows_publishable(core, req, chain, tables, spans, len(due))
    for col, pool in enumerate(tails):
        core.pools[pool].step(snaps[~fresh, col], "abort", req.rid)
        core.pools[pool].step(snaps[fresh, col], "publish", req.rid)
        req.owned[pool].difference_update(snaps[:, col].tolist())
        core.arena.tail_pages[blocks[fresh], col] = snaps[fresh, col]
        core.pools[pool].holders[snaps[fresh, col]] += 1  # one snapshot page per point: distinct
    for pool, (ks, point) in spans.items():
        keep = fresh[point]
        _hold_windows(core, req, pool, chain, tables[pool], ks[keep])
    core.arena.point[blocks[fresh]] = True


def _window_spans(core: Core, pool: int, due: list[int]) -> tuple[Ints, Ints]:
    """Blocks whose window pages the points at `due` read (concatenated), and the point of each."""
    spans = [np.arange(core.window_first_block(pool, b), b // core.block_tokens) for b in due]
    return np.concatenate(spans), np.repeat(np.arange(len(due)), [len(k) for k in spans])


def _windows_publishable(core: Core, req: RequestState, chain: AnyIds, tables: dict[int, AnyIds],
                         spans: dict[int, tuple[Ints, Ints]], points: int) -> NDArray[np.bool_]:
    """Per due point: every window page it would index is the request's own or still PUBLISHED.

    A window page the request pins can have been retired meanwhile (an evicted
    point held it); the index never references a retired page again, so such
    a point is not recorded (retention is best effort).
    """
    ok = np.ones(points, np.bool_)
    for pool, (ks, point) in spans.items():
        p, col, table = core.pools[pool], core.column[pool], tables[pool]
        have, mine = core.arena.window_pages[chain[ks], col], table[ks]
        bad = (have == NULL_PAGE) & (mine != NULL_PAGE) & (p.state[mine] != p.published) & (p.owner[mine] != req.rid)
        if np.count_nonzero(bad):
            ok &= np.bincount(point[bad], minlength=points) == 0
    return ok


def _hold_windows(core: Core, req: RequestState, pool: int, chain: AnyIds, table: AnyIds, ks: Ints) -> None:
    """Each new point holds one reference on every window page it needs (`ks`: their blocks, per point)."""
    if not ks.size:
        return
    col = core.column[pool]
    ids = chain[ks]
    have = core.arena.window_pages[ids, col]
    mine = table[ks]
    need = have == NULL_PAGE
    assert not np.count_nonzero(mine[need] == NULL_PAGE), "a recorded point's window page was released early"
    core.arena.window_pages[ids[need], col] = mine[need]
    add_counts(core.pools[pool].holders, np.where(need, mine, have), 1)
    blocks = np.zeros(len(table), np.bool_)
    blocks[ks[need]] = True
    own = table[blocks]  # each newly indexed page once (points' spans may overlap)
    _publish_own(core, req, pool, own[_owned_mask(core, req, pool, own, "READY")])


def _slide_windows(core: Core, req: RequestState) -> None:
    """Drop the request's window pages that neither its own window nor a pending point needs."""
    pending = [b for b in req.snapshots if b > req.computed]
    for pool in core.by_role[PoolRole.WINDOW]:
        keep_from = min([core.window_first_block(pool, req.computed)]
                        + [core.window_first_block(pool, b) for b in pending])
        table = req.tables[pool]
        floor, top = req.window_floor.get(pool, 0), min(keep_from, len(table))
        req.window_floor[pool] = max(floor, top)
        if top <= floor:
            continue
        gone = table[floor:top].astype(np.intp)
        gone = gone[gone != NULL_PAGE]
        mine = core.pools[pool].owner[gone] == req.rid
        aborts = gone[mine]
        core.pools[pool].step(aborts, "abort", req.rid)
        req.owned[pool].difference_update(aborts.tolist())
        unpin(core, req, pool, gone[~mine])
        table[floor:top] = NULL_PAGE


def unpin(core: Core, req: RequestState, pool: int, pages: Pages) -> None:
    """Drop the request's pins on distinct `pages`; reclaim retired pages nobody holds any more."""
    if not pages.size:
        return
    core.pools[pool].step(pages, "unpin", req.rid, leased_by_actor=True)
    pins = req.pinned_versions[pool]
    for page in pages.tolist():
        del pins[page]
    reclaim_retired(core, pool, pages)


def reclaim_retired(core: Core, pool: int, pages: Pages) -> None:
    p = core.pools[pool]
    state = p.table.state_index.get("RETIRED")
    if state is None:
        return
    retired = pages[(p.state[pages] == state) & (p.leases[pages] == 0)]
    if retired.size:
        p.step(np.unique(retired), "reclaim")
