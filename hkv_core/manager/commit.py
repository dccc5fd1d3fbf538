"""Commit: tokens were written; index their blocks, publish what completed, keep resume points.

What commit publishes at length L is exactly what match may return at L
(F7): blocks are indexed as soon as they are committed; each role publishes
the objects the tokens completed and the index refers to them; a resume
point is kept only with every object it needs published (its window pages,
its tail snapshots) and its block indexed.  Then the window slides.
"""

from __future__ import annotations

import numpy as np

from hkv_core.manager.core import Core
from hkv_core.manager.index import NO_BLOCK, NO_POINT
from hkv_core.manager.requests import RequestState


def commit(core: Core, req: RequestState, num_tokens: int) -> None:
    before = req.computed
    core.requests.set_committed(req, before + num_tokens)
    _index_blocks(core, req)
    for role in core.roles:
        role.commit(req, before)
    _keep_points(core, req)
    pending = req.pending_points
    for role in core.roles:
        role.after_commit(req, pending)


def _index_blocks(core: Core, req: RequestState) -> None:
    """Chain the request's newly complete blocks (found indexed, or added on reserved rows)."""
    start, blocks = len(req.chain), req.computed // core.block_tokens
    if blocks <= start:
        return
    keys = req.keys[start:blocks]
    found = core.index.lookup(keys)
    known = int(np.argmin(found >= 0)) if np.any(found < 0) else len(found)
    req.chain.extend(found[:known])
    if known < len(found):
        parent = req.chain[-1] if req.chain else NO_BLOCK
        req.chain.extend(core.index.add_chain(keys[known:], parent))
    core.index.unreserve(known, 0)  # rows reserved for blocks found indexed go back
    req.block_rows -= blocks - start
    core.index.touch(req.chain[start:blocks])


def _keep_points(core: Core, req: RequestState) -> None:
    """Keep the points whose boundaries are now committed (one per block; the first one stays)."""
    cut = next((i for i, b in enumerate(req.pending_points) if b > req.computed), len(req.pending_points))
    if not cut:
        return
    due = np.array(req.pending_points[:cut], np.int64)
    del req.pending_points[:cut]
    blocks = req.chain.view()[due // core.block_tokens - 1]
    keep = core.index.blocks.point[blocks] == NO_POINT
    for role in core.roles:
        keep &= role.points_ready(req, due)
    objects = [m for role in core.roles for m in role.take_points(req, due, keep)]
    core.index.keep_points(blocks[keep], due[keep], objects)
    core.index.unreserve(0, int(np.count_nonzero(~keep)))
    req.point_rows -= len(due)
