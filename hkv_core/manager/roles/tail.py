"""TailRole: compressor-tail rows (main and indexer compressors) and linear layers' recurrent states, one
snapshot page per resume point.

A request computes into one working tail page per tail pool, seeded at its
first allocation by copying the hit point's snapshot rows; at every boundary
where it keeps a point it writes the tail rows into a fresh snapshot page,
published and referred to by the point when the boundary is committed.  A
recurrent state is a tail of one entry that every token rewrites: the same
snapshots and copy-on-write seed, with one page per end a speculative step may
be accepted at (`PoolSpec.point_entries` / `point_start_token` say which).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from hkv_core.arrays import all_true
from hkv_core.manager.index import NO_POINT
from hkv_core.manager.page_pools import NULL_OBJECT, PoolSlots
from hkv_core.manager.requests import DraftState, RequestState
from hkv_core.manager.roles.base import (
    MISSING_CODE,
    NEVER_FULL,
    NO_DEMAND,
    Bools,
    Builder,
    Condition,
    Demand,
    Index,
    Moves,
    Role,
)
from hkv_core.manager.roles.window import point_kept
from hkv_core.spec.names import Event


class TailRole(Role):
    """Tail page pools, each a one-object column of the point table."""

    FIRES: tuple[Event, ...] = (Event.FILL, Event.COPY_DONE, Event.COPY_FAIL, Event.PUBLISH)

    def conditions(self, ids: NDArray[np.int32], lo: int) -> list[Condition]:
        kept = point_kept(self, ids, lo)
        return [("multi_group", MISSING_CODE[p.spec.kind], p.name, kept) for p in self.pools]

    def hit_objects(self, ids: NDArray[np.int32], point: int) -> list[Index]:
        if point == NO_POINT:
            return [np.zeros(0, np.intp) for _ in self.pools]
        row = np.array([point])
        return [self.shared.index.points.objects(row, col)[0].astype(np.intp) for col in self.columns]

    def seed(self, req: RequestState, objs: list[Index]) -> None:
        for pool, got in zip(self.pools, objs, strict=True):
            if got.size:
                req.tail_sources[pool.index] = int(got[0])

    # ---------------------------------------------------------- allocate

    def demands(self, req: RequestState, start: int, end: int, boundaries: list[int]) -> list[Demand]:
        out = []
        for pool in self.pools:
            if req.tables[pool.index] and not boundaries:
                out.append(NO_DEMAND)
                continue
            tokens = np.array([NEVER_FULL] * (not req.tables[pool.index]) + boundaries, np.int64)
            out.append((len(tokens), tokens, tokens))
        return out

    def place(self, req: RequestState, start: int, end: int, boundaries: list[int], got: list[Index],
              out: Builder) -> None:
        for pool, objs in zip(self.pools, got, strict=True):
            table, slot = req.tables[pool.index], self.objects.slot
            if not table:
                table.extend(objs[:1], slot[objs[:1]])
                self._seed_copy(pool, req, int(objs[0]), out)
                objs = objs[1:]
            req.snapshots.setdefault(pool.index, []).extend(objs.tolist())  # one per pending point, in order
            for b, page in zip(boundaries, slot[objs].tolist(), strict=True):
                snap = out.snapshots.setdefault(b, {})
                for member in pool.spec.members:
                    snap[member.name] = page
            working = int(slot[table[0]])
            for member in pool.spec.members:
                out.tail_pages[member.name] = working

    def _seed_copy(self, pool: PoolSlots, req: RequestState, working: int, out: Builder) -> None:
        """Seed the working tail page from the hit's snapshot (the rows each member keeps at the hit)."""
        src = req.tail_sources.pop(pool.index, NULL_OBJECT)
        if src != NULL_OBJECT:
            rows = [m.point_entries(req.hit_tokens) for m in pool.spec.members]
            out.copy(self.objects, pool, src, working, rows)

    # ---------------------------------------------------------- speculative steps

    def segments(self, pool: PoolSlots, req: RequestState, end: int) -> tuple[list[int], list[int]]:
        """(every end E a step over the request's next tokens up to `end` may be accepted at, the last E of
        each run of E whose tails start at the same rows in every member pool): one page per run holds the
        tail at each of its E in rows [0, tail_rows(E))."""
        ends = list(range(max(len(req.tokens), req.computed + 1), end + 1))
        starts = [tuple(m.point_start_token(e) for m in pool.spec.members) for e in ends]
        last = [e for i, e in enumerate(ends) if i + 1 == len(ends) or starts[i + 1] != starts[i]]
        return ends, last

    def draft_demands(self, req: RequestState, start: int, end: int, boundaries: list[int]) -> list[Demand]:
        out = []
        for pool in self.pools:
            tokens = np.array([NEVER_FULL] * len(self.segments(pool, req, end)[1]) + boundaries, np.int64)
            out.append((len(tokens), tokens, tokens))
        return out

    def draft_place(self, req: RequestState, start: int, end: int, boundaries: list[int], got: list[Index],
                    out: Builder, draft: DraftState) -> None:
        """The step reads the working tail at `start` (never writes it: it is the checkpoint) and writes the
        tail at every E into its run's page, and the tail at each retained boundary into a snapshot page."""
        slot = self.objects.slot
        for pool, objs in zip(self.pools, got, strict=True):
            ends, last = self.segments(pool, req, end)
            segs, snaps = objs[:len(last)].tolist(), objs[len(last):].tolist()
            draft.segments[pool.index] = list(zip(last, segs, strict=True))
            draft.snapshots[pool.index] = snaps
            run = 0
            for e in ends:
                run += e > last[run]
                for member in pool.spec.members:
                    out.draft_tails.setdefault(e, {})[member.name] = int(slot[segs[run]])
            for b, obj in zip(boundaries, snaps, strict=True):
                for member in pool.spec.members:
                    out.snapshots.setdefault(b, {})[member.name] = int(slot[obj])
            working = req.tables[pool.index][0]
            for member in pool.spec.members:
                out.tail_pages[member.name] = int(slot[working])
            self._checkpoint(pool, req, working, segs[0], ends[0], out)

    def _checkpoint(self, pool: PoolSlots, req: RequestState, working: int, first: int, end: int,
                    out: Builder) -> None:
        """Copy the working tail's rows into the step's first tail page where its tail starts at the same row
        (a plan op): a verification kernel that updates a tail in place runs on that copy, never on the
        working tail, which stays the checkpoint a rejection returns to."""
        start = req.computed
        rows = [m.point_entries(start) if m.point_start_token(end) == m.point_start_token(start) else 0
                for m in pool.spec.members]
        out.copy(self.objects, pool, working, first, rows)

    def settle_draft(self, req: RequestState, draft: DraftState, end: int, moves: Moves) -> None:
        """The page holding the tail at `end` becomes the working tail (the old one is given back), unless
        nothing of the step stays; snapshots of retained boundaries up to `end` join the pending ones."""
        for pool in self.pools:
            segs = draft.segments[pool.index]
            chosen = next((obj for last, obj in segs if end <= last), NULL_OBJECT) if end > draft.start \
                else NULL_OBJECT
            if chosen != NULL_OBJECT:
                table = req.tables[pool.index]
                moves.add(Event.ACCEPT, np.array([chosen], np.intp))
                moves.add(Event.ABORT, np.array([table[0]], np.intp))
                table.put(0, chosen, int(self.objects.slot[chosen]))
            moves.add(Event.REJECT, np.array([obj for _, obj in segs if obj != chosen], np.intp))
            snaps = draft.snapshots[pool.index]
            kept = sum(b <= end for b in draft.boundaries)
            moves.add(Event.ACCEPT, np.array(snaps[:kept], np.intp))
            moves.add(Event.REJECT, np.array(snaps[kept:], np.intp))
            req.snapshots.setdefault(pool.index, []).extend(snaps[:kept])

    # ---------------------------------------------------------- commit

    def take_points(self, req: RequestState, due: NDArray[np.int64], keep: Bools,
                    moves: Moves) -> list[NDArray[np.int32]]:
        n, snaps = len(due), np.empty((len(due), len(self.pools)), np.intp)
        for i, pool in enumerate(self.pools):  # the first n snapshots are the due points' (pending, in order)
            listed = req.snapshots[pool.index]
            snaps[:, i] = listed[:n]
            del listed[:n]
        if all_true(keep):  # every due point is kept (the usual case): no selection
            moves.add(Event.PUBLISH, snaps.T.ravel())
            kept = snaps.astype(np.int32)
        else:
            moves.add(Event.ABORT, snaps[~keep].T.ravel())  # pool by pool: a step splits them in few runs
            moves.add(Event.PUBLISH, snaps[keep].T.ravel())
            kept = snaps[keep].astype(np.int32)
        return [kept[:, i:i + 1] for i in range(len(self.pools))]

    def finish(self, req: RequestState, moves: Moves) -> None:
        for pool in self.pools:
            pending = np.array(req.snapshots.pop(pool.index, []), np.intp)
            self.give_back(req, np.concatenate([req.tables[pool.index].view(), pending]), moves)
        req.tail_sources.clear()

    def audit(self, req: RequestState) -> list[str]:
        out = []
        for pool in self.pools:
            table = req.tables[pool.index]
            if req.allocated > req.hit_tokens and (not table or self.objects.owner[table[0]] != req.slot):
                out.append(f"request {req.rid} computes without its own {pool.name} working page")
        return out

    # ---------------------------------------------------------- eviction

    def points_pinned(self, points: NDArray[np.int32]) -> Bools:
        pinned = np.zeros(len(points), np.bool_)
        for col in self.columns:
            pinned |= self.objects.leases[self.shared.index.points.objects(points, col)[:, 0]] > 0
        return pinned

    def refs(self, points: NDArray[np.int32], point_pos: Index, blocks: NDArray[np.int32],
             block_pos: Index) -> list[tuple[NDArray[np.int32], Index]]:
        points_table = self.shared.index.points
        return [(points_table.objects(points, col)[:, 0], point_pos) for col in self.columns]
