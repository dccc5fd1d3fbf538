"""TailRole: compressor-tail rows (main and indexer compressors), one snapshot page per resume point.

A request computes into one working tail page per tail pool, seeded at its
first allocation by copying the hit point's snapshot rows; at every boundary
where it keeps a point it writes the tail rows into a fresh snapshot page,
published and referred to by the point when the boundary is committed.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.index import NO_POINT
from hkv_core.manager.page_pool import NULL_OBJECT, PagePool
from hkv_core.manager.requests import RequestState
from hkv_core.manager.roles.base import MISSING_CODE, NEVER_FULL, Bools, Builder, Condition, Index, Role, Shared
from hkv_core.manager.roles.window import point_kept
from hkv_core.spec.names import Event
from hkv_core.units import tail_rows


class TailRole(Role):
    """Tail page pools, each a one-object column of the point table."""

    def __init__(self, shared: Shared, pools: tuple[PagePool, ...], first_column: int) -> None:
        super().__init__(shared, pools, first_column)
        self.position = {pool.spec.index: i for i, pool in enumerate(pools)}  # column in req.snapshots

    def conditions(self, ids: NDArray[np.int32], lo: int) -> list[Condition]:
        kept = point_kept(self, ids, lo)
        return [("multi_group", MISSING_CODE[p.spec.kind], p.name, kept) for p in self.pools]

    def hit_objects(self, ids: NDArray[np.int32], point: int) -> list[Index]:
        if point == NO_POINT:
            return [np.zeros(0, np.intp) for _ in self.pools]
        points = self.shared.index.points
        return [points.objects(np.array([point]), col)[0].astype(np.intp) for col in self.columns]

    def seed(self, req: RequestState, objs: list[Index]) -> None:
        for pool, got in zip(self.pools, objs, strict=True):
            if got.size:
                req.tail_sources[pool.spec.index] = int(got[0])

    # ---------------------------------------------------------- allocate

    def needs(self, req: RequestState, start: int, end: int, boundaries: list[int]) -> list[int]:
        return [(not req.tables[p.spec.index]) + len(boundaries) for p in self.pools]

    def place(self, req: RequestState, start: int, end: int, boundaries: list[int], out: Builder) -> None:
        for i, pool in enumerate(self.pools):
            table = req.tables[pool.spec.index]
            working = not table
            tokens = np.array([NEVER_FULL] * working + boundaries, np.int64)
            objs = pool.reserve(len(tokens), req.slot, tokens, tokens)
            if working:
                table.append(int(objs[0]))
                self._seed_copy(pool, req, int(objs[0]), out)
            for b, obj in zip(boundaries, objs[working:].tolist(), strict=True):
                req.snapshots.setdefault(b, np.zeros(len(self.pools), np.intp))[i] = obj
                for member in pool.spec.members:
                    out.snapshots.setdefault(b, {})[member.name] = int(pool.slot[obj])
            for member in pool.spec.members:
                out.tail_pages[member.name] = int(pool.slot[table[0]])

    def _seed_copy(self, pool: PagePool, req: RequestState, working: int, out: Builder) -> None:
        """Seed the working tail page from the hit's snapshot (the rows each member keeps at the hit)."""
        src = req.tail_sources.pop(pool.spec.index, NULL_OBJECT)
        if src != NULL_OBJECT:
            out.copy(pool, src, working, [tail_rows(req.hit_tokens, m.compress_ratio) for m in pool.spec.members])

    # ---------------------------------------------------------- commit

    def take_points(self, req: RequestState, due: NDArray[np.int64], keep: Bools) -> list[NDArray[np.int32]]:
        snaps = np.array([req.snapshots.pop(int(b)) for b in due], np.intp).reshape(len(due), len(self.pools))
        out = []
        for i, pool in enumerate(self.pools):
            pool.step(snaps[~keep, i], pool.ev[Event.ABORT], req.slot)
            pool.step(snaps[keep, i], pool.ev[Event.PUBLISH], req.slot)
            out.append(snaps[keep, i:i + 1].astype(np.int32))
        return out

    def release(self, req: RequestState) -> None:
        pending = np.array(list(req.snapshots.values()), np.intp).reshape(-1, len(self.pools))
        req.snapshots.clear()
        req.tail_sources.clear()
        for i, pool in enumerate(self.pools):
            self.abort_owned(pool, req, np.concatenate([req.tables[pool.spec.index].view(), pending[:, i]]))
            self.unpin_all(pool, req)

    def audit(self, req: RequestState) -> list[str]:
        out = []
        for pool in self.pools:
            table = req.tables[pool.spec.index]
            if req.allocated > req.hit_tokens and (not table or not self.owned(pool, req, table.view())[0]):
                out.append(f"request {req.rid} computes without its own {pool.name} working page")
        return out

    # ---------------------------------------------------------- eviction

    def points_pinned(self, points: NDArray[np.int32]) -> Bools:
        pinned = np.zeros(len(points), np.bool_)
        for pool, col in zip(self.pools, self.columns, strict=True):
            pinned |= pool.leases[self.shared.index.points.objects(points, col)[:, 0]] > 0
        return pinned

    def refs(self, points: NDArray[np.int32], point_pos: Index, blocks: NDArray[np.int32],
             block_pos: Index) -> list[tuple[PagePool, NDArray[np.int32], Index]]:
        points_table = self.shared.index.points
        return [(pool, points_table.objects(points, col)[:, 0], point_pos)
                for pool, col in zip(self.pools, self.columns, strict=True)]
