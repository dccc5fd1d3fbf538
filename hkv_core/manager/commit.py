"""Commit: tokens were written; index their blocks, publish what completed, keep resume points.

What commit publishes at length L is exactly what match may return at L
(F7): blocks are indexed as soon as they are committed; each role says which
objects the tokens completed and which blocks refer to them; a resume point
is kept only with every object it needs published (its window pages, its
tail snapshots) and its block indexed.  Then the window slides.  Each event
is fired once over the objects of every role and pool, in this order:
publish (pinned: the request still reads them; tail snapshots unpinned),
attach to blocks, keep points, give back what slid out.
"""

from __future__ import annotations

import bisect

import numpy as np

from hkv_core.manager import retention
from hkv_core.manager.core import Core
from hkv_core.manager.index import NO_BLOCK, NO_POINT
from hkv_core.manager.requests import RequestState
from hkv_core.manager.roles import Moves
from hkv_core.spec.names import Event


def commit(core: Core, req: RequestState, num_tokens: int) -> None:
    before = req.computed
    core.requests.set_committed(req, before + num_tokens)
    _index_blocks(core, req)
    moves = Moves()
    for role in core.roles:
        role.completed(req, before, moves)
    points = _plan_points(core, req, moves)
    publish(core, req, moves)
    core.index.attach(moves.attach)
    if points is not None:
        blocks, due, objects = points
        prompt_end, junction = retention.anchors(core, req)
        core.index.keep_points(blocks, due, objects, moves.point_holds, (due == prompt_end) | (due == junction))
    for role in core.roles:
        role.slide(req, req.pending_points, moves)
    give_back(core, req, moves)


def publish(core: Core, req: RequestState, moves: Moves) -> None:
    """Publish what the roles planned: pinned (the request reads on) or not (tail snapshots), one step each."""
    objects = core.objects
    pinned = moves.take(Event.PUBLISH_PINNED)
    objects.step(pinned, Event.PUBLISH_PINNED, req.slot)
    req.pins.add(pinned, objects.version[pinned])
    objects.step(moves.take(Event.PUBLISH), Event.PUBLISH, req.slot)


def give_back(core: Core, req: RequestState, moves: Moves) -> None:
    """Abort what the request owns and no longer needs; unpin what it pinned and no longer reads."""
    objects = core.objects
    objects.step(moves.take(Event.ABORT), Event.ABORT, req.slot)
    unpinned = moves.take(Event.UNPIN)
    if unpinned.size:
        objects.step(unpinned, Event.UNPIN, req.slot)
        req.pins.remove(objects.lease_mark(unpinned, req.pins.objs))
        objects.settle(unpinned)


def _index_blocks(core: Core, req: RequestState) -> None:
    """Chain the request's newly complete blocks (found indexed, or added on reserved rows)."""
    start, blocks = len(req.chain), req.computed // core.block_tokens
    if blocks <= start:
        return
    keys = req.keys[start:blocks]
    if core.index.lookup(keys[:1])[0] < 0:  # presence is monotone along a chain: all new
        known = 0
    else:
        found = core.index.lookup(keys)
        known = int(np.argmin(found >= 0)) if np.any(found < 0) else len(found)
        req.chain.extend(found[:known])
    if known < len(keys):
        parent = req.chain[-1] if req.chain else NO_BLOCK
        bt = core.block_tokens
        req.chain.extend(core.index.add_chain(keys[known:], parent, req.tokens[(start + known) * bt:blocks * bt],
                                              req.extra.lora_id))
    core.index.unreserve(known, 0)  # rows reserved for blocks found indexed go back
    req.block_rows -= blocks - start  # no LRU entry yet: a live chain is never evicted; release orders it


def _plan_points(core: Core, req: RequestState,
                 moves: Moves) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]] | None:
    """The points whose boundaries are now committed (one per block; a block's first point stays)."""
    cut = bisect.bisect_right(req.pending_points, req.computed)  # pending points are ascending
    if not cut:
        return None
    due = np.array(req.pending_points[:cut], np.int64)
    del req.pending_points[:cut]
    blocks = req.chain.view()[due // core.block_tokens - 1].astype(np.intp)  # (intp: faster gathers)
    keep = core.index.blocks.point[blocks] == NO_POINT
    for role in core.roles:
        ready = role.points_ready(req, due, moves)
        if ready is not None:
            keep &= ready
    objects = [m for role in core.roles for m in role.take_points(req, due, keep, moves)]
    core.index.unreserve(0, len(due) - int(np.count_nonzero(keep)))
    req.point_rows -= len(due)
    return blocks[keep], due[keep], objects
