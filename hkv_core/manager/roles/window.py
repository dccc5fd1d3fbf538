"""WindowRole: sliding-window rows, pages of one or more blocks, read over [P - W + 1, P) by a point at P.

A window page holds `tokens_per_page` rows, a whole number of blocks (an
engine such as vLLM lays DeepSeek-V4's window out in 64-token pages over
4-token hash blocks).  A resume point is kept only where every window page
before it is complete (P a multiple of the page): a page is shared only
whole.  A resume point refers to its own window pages (the point table's columns):
a window page stays cached exactly as long as a point needs it, and a hit at
P is usable exactly when a point is kept at P (one definition for match and
acquire).  While a request computes, its window slides: pages that neither
its position nor a pending point needs are given back (or unpinned) at each
commit.  A page still pinned by a request when its last point goes is
RETIRED (out of the index) and reclaimed at the last unpin.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from hkv_core.arrays import all_true, distinct
from hkv_core.manager.index import NO_POINT
from hkv_core.manager.page_pools import NULL_OBJECT, PoolSlots
from hkv_core.manager.requests import RequestState, Table
from hkv_core.manager.roles.base import (
    MISSING_CODE,
    NO_DEMAND,
    Bools,
    Builder,
    Condition,
    Demand,
    Index,
    Moves,
    Role,
    Shared,
    slots_of,
)
from hkv_core.spec.names import Event


def window_width(window_tokens: int, page_tokens: int) -> int:
    """Pages overlapping [P - W + 1, P) for a P on a page boundary: ceil((W - 1) / page)."""
    return max(1, -(-(window_tokens - 1) // page_tokens))


class WindowRole(Role):
    """Window page pools, each a column of the point table."""

    FIRES = (Event.PUBLISH_PINNED, Event.RETIRE, Event.RECLAIM, Event.FILL, Event.COPY_DONE, Event.COPY_FAIL)

    def __init__(self, shared: Shared, pools: tuple[PoolSlots, ...], first_column: int) -> None:
        super().__init__(shared, pools, first_column)
        self.window = [p.spec.window_tokens for p in pools]
        self.page = [p.spec.tokens_per_page for p in pools]  # tokens per window page: a whole number of blocks
        self.width = [window_width(w, t) for w, t in zip(self.window, self.page, strict=True)]
        self._offsets = [np.arange(w) for w in self.width]

    def first_page(self, i: int, boundary: int) -> int:
        """First page whose rows a resume point at `boundary` reads in pool i."""
        return max(0, boundary - self.window[i] + 1) // self.page[i]

    # ---------------------------------------------------------- match / acquire

    def conditions(self, ids: NDArray[np.int32], lo: int) -> list[Condition]:
        kept = point_kept(self, ids, lo)
        return [("multi_group", MISSING_CODE[p.spec.kind], p.name, kept) for p in self.pools]

    def hit_objects(self, ids: NDArray[np.int32], point: int) -> list[Index]:
        if point == NO_POINT:
            return [np.zeros(0, np.intp) for _ in self.pools]
        b, out = len(ids) * self.bt, []
        for i in range(len(self.pools)):
            row = self.shared.index.points.objects(np.array([point]), self.columns[i])[0]
            out.append(row[self.width[i] - (b // self.page[i] - self.first_page(i, b)):].astype(np.intp))
        return out

    def seed(self, req: RequestState, objs: list[Index]) -> None:
        for i, (pool, got) in enumerate(zip(self.pools, objs, strict=True)):
            first = self.first_page(i, req.hit_tokens) if got.size else 0
            pad = np.zeros(first, np.int32)
            req.tables[pool.index] = Table(np.concatenate([pad, got]), np.concatenate([pad, self.objects.slot[got]]))
            req.window_floor[pool.index] = first

    # ---------------------------------------------------------- allocate

    def demands(self, req: RequestState, start: int, end: int, boundaries: list[int]) -> list[Demand]:
        out = []
        for pool, tokens in zip(self.pools, self.page, strict=True):
            have, last = len(req.tables[pool.index]), (end - 1) // tokens + 1
            if last <= have:
                out.append(NO_DEMAND)
                continue
            pages = np.arange(have, last)
            out.append((len(pages), pages * tokens + 1, (pages + 1) * tokens))
        return out

    def place(self, req: RequestState, start: int, end: int, boundaries: list[int], got: list[Index],
              out: Builder) -> None:
        for pool, objs, tokens in zip(self.pools, got, self.page, strict=True):
            table = req.tables[pool.index]
            if objs.size:
                table.extend(objs, self.objects.slot[objs])
            pages = table.page_view()
            out.share(pool, out.tables, pages)
            out.share(pool, out.slots, slots_of(pages, tokens, start, end))  # one row per token

    # ---------------------------------------------------------- commit

    def _spans(self, i: int, req: RequestState, due: NDArray[np.int64]) -> tuple[NDArray[np.int32], Bools]:
        """Per due point, its window objects right-aligned in a row of `width` (NULL_OBJECT where the
        window reaches before token 0), and which entries of the row its window covers."""
        table, width, tokens = req.tables[self.pools[i].index].view(), self.width[i], self.page[i]
        cols = (due // tokens)[:, None] - width + self._offsets[i]
        covered = cols >= (np.maximum(0, due - self.window[i] + 1) // tokens)[:, None]
        objs = table[np.where(covered, cols, 0)].astype(np.int32)  # blocks before token 0: read block 0, then
        objs[~covered] = NULL_OBJECT                               # cleared
        return objs, covered

    def points_ready(self, req: RequestState, due: NDArray[np.int64], moves: Moves) -> Bools:
        """A point needs every window page of its span whole (the point on a page boundary), each the request's
        own or still PUBLISHED (not retired)."""
        ok = np.ones(len(due), np.bool_)
        o = self.objects
        for i, pool in enumerate(self.pools):
            objs, covered = moves.spans[pool.index] = self._spans(i, req, due)  # take_points reads them again
            usable = self.owned(req, objs) | o.published[o.code[objs]]  # NULL_OBJECT: neither, so only uncovered
            ok &= np.logical_and.reduce(usable | ~covered, axis=1) & (due % self.page[i] == 0)
        return ok

    def take_points(self, req: RequestState, due: NDArray[np.int64], keep: Bools,
                    moves: Moves) -> list[NDArray[np.int32]]:
        out = []
        for pool, column in zip(self.pools, self.columns, strict=True):
            objs = moves.spans[pool.index][0][keep]  # points_ready of this commit left them
            listed = objs[objs != NULL_OBJECT].astype(np.intp)
            flat = listed if all_true(listed[1:] > listed[:-1]) else distinct(listed)  # already distinct, sorted
            moves.add(Event.PUBLISH_PINNED, flat[self.owned(req, flat)])  # the request still reads them
            if flat.size == listed.size:  # windows of the points do not overlap: one reference each
                moves.point_holds[column] = (flat, None)
            out.append(objs)
        return out

    def slide(self, req: RequestState, pending: list[int], moves: Moves) -> None:
        """Give back window pages below what the position and every pending point need."""
        for i, pool in enumerate(self.pools):
            keep_from = self.first_page(i, min(req.computed, pending[0]) if pending else req.computed)  # monotone
            self.release_below(req, pool, keep_from, moves)

    def finish(self, req: RequestState, moves: Moves) -> None:
        for pool in self.pools:
            self.give_back(req, req.tables[pool.index].view(), moves)

    def audit(self, req: RequestState) -> list[str]:
        out = []
        for i, pool in enumerate(self.pools):
            table = req.tables[pool.index].view()
            end = -(-req.computed // self.page[i])
            if len(table) < end or np.any(table[self.first_page(i, req.computed):end] == NULL_OBJECT):
                out.append(f"request {req.rid} lacks {pool.name} window pages its position {req.computed} reads")
        return out

    # ---------------------------------------------------------- eviction

    def refs(self, points: NDArray[np.int32], point_pos: Index, blocks: NDArray[np.int32],
             block_pos: Index) -> list[tuple[NDArray[np.int32], Index]]:
        points_table = self.shared.index.points
        return [(points_table.objects(points, col).ravel(), np.repeat(point_pos, width))
                for col, width in zip(self.columns, self.width, strict=True)]


def point_kept(role: Role, ids: NDArray[np.int32], lo: int) -> Bools:
    """Per candidate b in [lo, len(ids)]: is a resume point kept at b (b = 0 needs none)."""
    ends = ids[max(lo, 1) - 1:]  # the last block of each candidate b >= 1
    kept = np.zeros(len(ids) + 1 - lo, np.bool_)
    kept[len(kept) - len(ends):] = role.shared.index.blocks.point[ends] != NO_POINT
    if lo == 0:
        kept[0] = True
    return kept
