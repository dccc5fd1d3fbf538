"""WindowRole: sliding-window rows, one page per block, read over [P - W + 1, P) by a resume point at P.

A resume point refers to its own window pages (the point table's columns):
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

from hkv_core.manager.id_list import IdList
from hkv_core.manager.index import NO_POINT
from hkv_core.manager.page_pool import NULL_OBJECT, PagePool
from hkv_core.manager.requests import RequestState
from hkv_core.manager.roles.base import MISSING_CODE, Bools, Builder, Condition, Index, Role, Shared
from hkv_core.spec.names import Event


def window_width(window_tokens: int, block_tokens: int) -> int:
    """Blocks overlapping [P - W + 1, P) for a P on a block boundary: ceil((W - 1) / block)."""
    return max(1, -(-(window_tokens - 1) // block_tokens))


class WindowRole(Role):
    """Window page pools, each a column of the point table."""

    def __init__(self, shared: Shared, pools: tuple[PagePool, ...], first_column: int) -> None:
        super().__init__(shared, pools, first_column)
        self.window = [p.spec.window_tokens for p in pools]
        self.width = [window_width(w, self.bt) for w in self.window]

    def first_block(self, i: int, boundary: int) -> int:
        """First block whose rows a resume point at `boundary` reads in pool i."""
        return max(0, boundary - self.window[i] + 1) // self.bt

    # ---------------------------------------------------------- match / acquire

    def conditions(self, ids: NDArray[np.int32], lo: int) -> list[Condition]:
        kept = point_kept(self, ids, lo)
        return [("multi_group", MISSING_CODE[p.spec.kind], p.name, kept) for p in self.pools]

    def hit_objects(self, ids: NDArray[np.int32], point: int) -> list[Index]:
        if point == NO_POINT:
            return [np.zeros(0, np.intp) for _ in self.pools]
        b = len(ids) * self.bt
        out = []
        for i in range(len(self.pools)):
            row = self.shared.index.points.objects(np.array([point]), self.columns[i])[0]
            out.append(row[self.width[i] - (len(ids) - self.first_block(i, b)):].astype(np.intp))
        return out

    def seed(self, req: RequestState, objs: list[Index]) -> None:
        for i, (pool, got) in enumerate(zip(self.pools, objs, strict=True)):
            first = self.first_block(i, req.hit_tokens) if got.size else 0
            req.tables[pool.spec.index] = IdList(np.concatenate([np.zeros(first, np.int32), got]))
            req.window_floor[pool.spec.index] = first

    # ---------------------------------------------------------- allocate

    def needs(self, req: RequestState, start: int, end: int, boundaries: list[int]) -> list[int]:
        return [(end - 1) // self.bt + 1 - len(req.tables[p.spec.index]) for p in self.pools]

    def place(self, req: RequestState, start: int, end: int, boundaries: list[int], out: Builder) -> None:
        for pool in self.pools:
            table = req.tables[pool.spec.index]
            blocks = np.arange(len(table), (end - 1) // self.bt + 1)
            table.extend(pool.reserve(len(blocks), req.slot, blocks * self.bt + 1, (blocks + 1) * self.bt))
            pages = pool.slot[table.view()]
            rows = np.arange(start, end)
            out.share(pool, out.tables, pages)
            out.share(pool, out.slots, pages[rows // self.bt].astype(np.int64) * self.bt + rows % self.bt)

    # ---------------------------------------------------------- commit

    def _spans(self, i: int, req: RequestState, due: NDArray[np.int64]) -> tuple[NDArray[np.int32], Bools]:
        """Per due point, its window objects right-aligned in a row of `width` (NULL_OBJECT where the
        window reaches before token 0), and which entries of the row its window covers."""
        table, width = req.tables[self.pools[i].spec.index].view(), self.width[i]
        cols = (due // self.bt)[:, None] - width + np.arange(width)
        firsts = np.array([self.first_block(i, int(b)) for b in due], np.int64)
        covered = cols >= firsts[:, None]
        objs = np.where(covered, table[np.clip(cols, 0, max(0, len(table) - 1))], NULL_OBJECT)
        return np.asarray(objs, np.int32), covered

    def points_ready(self, req: RequestState, due: NDArray[np.int64]) -> Bools:
        """A point needs every window page of its span, each the request's own or still PUBLISHED (not retired)."""
        ok = np.ones(len(due), np.bool_)
        for i, pool in enumerate(self.pools):
            objs, covered = self._spans(i, req, due)
            usable = (objs != NULL_OBJECT) & (self.owned(pool, req, objs) | (pool.state[objs] == pool.s_published))
            ok &= np.all(usable | ~covered, axis=1)
        return ok

    def take_points(self, req: RequestState, due: NDArray[np.int64], keep: Bools) -> list[NDArray[np.int32]]:
        out = []
        for i, pool in enumerate(self.pools):
            objs, _ = self._spans(i, req, due[keep])
            flat = np.unique(objs[objs != NULL_OBJECT]).astype(np.intp)
            self.publish_pinned(pool, req, flat[self.owned(pool, req, flat)])
            out.append(objs)
        return out

    def after_commit(self, req: RequestState, pending: list[int]) -> None:
        """Slide: give back window pages below what the position and every pending point need."""
        for i, pool in enumerate(self.pools):
            lane = pool.spec.index
            keep_from = min([self.first_block(i, req.computed)] + [self.first_block(i, b) for b in pending])
            table, floor = req.tables[lane], req.window_floor[lane]
            top = min(keep_from, len(table))
            if top <= floor:
                continue
            gone = table[floor:top].astype(np.intp)
            self._give_back(pool, req, gone[gone != NULL_OBJECT])
            table[floor:top] = NULL_OBJECT
            req.window_floor[lane] = top

    def _give_back(self, pool: PagePool, req: RequestState, gone: Index) -> None:
        mine = self.owned(pool, req, gone)
        pool.step(gone[mine], pool.ev[Event.ABORT], req.slot)
        pinned = gone[~mine]
        if pinned.size:
            pins = req.pins[pool.spec.index]
            pool.step(pinned, pool.ev[Event.UNPIN], req.slot)
            pins.remove(pool.lease_mark(pinned, pins.objs.view().astype(np.intp)))
            pool.settle(pinned)

    def release(self, req: RequestState) -> None:
        for pool in self.pools:
            self.abort_owned(pool, req, req.tables[pool.spec.index].view())
            self.unpin_all(pool, req)

    def audit(self, req: RequestState) -> list[str]:
        out = []
        for i, pool in enumerate(self.pools):
            table = req.tables[pool.spec.index].view()
            span = table[self.first_block(i, req.computed):-(-req.computed // self.bt)]
            if np.any(span == NULL_OBJECT) or len(table) < -(-req.computed // self.bt):
                out.append(f"request {req.rid} lacks {pool.name} window pages its position {req.computed} reads")
        return out

    # ---------------------------------------------------------- eviction

    def refs(self, points: NDArray[np.int32], point_pos: Index, blocks: NDArray[np.int32],
             block_pos: Index) -> list[tuple[PagePool, NDArray[np.int32], Index]]:
        out = []
        for i, pool in enumerate(self.pools):
            objs = self.shared.index.points.objects(points, self.columns[i])
            out.append((pool, objs.ravel(), np.repeat(point_pos, self.width[i])))
        return out


def point_kept(role: Role, ids: NDArray[np.int32], lo: int) -> Bools:
    """Per candidate b in [lo, len(ids)]: is a resume point kept at b (b = 0 needs none)."""
    ends = ids[max(lo, 1) - 1:]  # the last block of each candidate b >= 1
    kept = np.zeros(len(ids) + 1 - lo, np.bool_)
    kept[len(kept) - len(ends):] = role.shared.index.blocks.point[ends] != NO_POINT
    if lo == 0:
        kept[0] = True
    return kept
