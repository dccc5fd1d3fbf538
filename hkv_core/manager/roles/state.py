"""StateRole: an engine's recurrent state laid out per block column (vLLM's Mamba / Gated DeltaNet groups).

vLLM keeps a linear layer's state in its block table, one column per block:
a step that ends at token E writes the state after E into column
(E - 1) // T (T tokens per block), first copying in the state its previous
step left in an earlier column; columns a step skips stay empty.  So column
k holds the state at (k + 1) * T exactly when a step ended there, and only
then may a resume point at (k + 1) * T refer to it.  Each commit ends where
the engine's step ended (the engine reports written tokens step by step), so
a point is kept only at the end of a commit.

Per request the role keeps a table of columns: an allocation takes one page,
for the column of its last token, and leaves the columns before it NULL (the
engine reads none of them).  A kept point's page is published pinned: the
request's next step still copies from it; the request gives it up when it
leaves that column (`slide`), and eviction never drops a point whose page a
request pins (as a tail snapshot).  A hit at P reads the one page of column
P / T - 1 and computes in pages of its own: the state there is never written.
Speculative steps are not served (an engine's speculative state columns).

With `allow_partial_page_copy` a point may also lie inside a column, on any
block boundary t (vLLM's sub-block hits, a state block of several hash
blocks).  Column (t - 1) // T holds the state at t only until the request's
next step ending in that column overwrites it, so such a point is kept

- at the end of a commit, on the column's own page, which the request then
  never writes again: a later step ending in that column takes a copy of it
  (copy on write, as a hit inside a column does) - an engine whose tables
  only grow commits there only when the request's next step leaves the
  column, or when it ends;
- or on a snapshot page: an allocation that starts at a pending point t of
  the prompt (or its junction) inside a column and ends in that column takes
  a page with a copy of the column, made before the step writes it; the
  point is kept there once a commit passes t.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from hkv_core.errors import InvalidRequestState
from hkv_core.manager.page_pools import NULL_OBJECT, PoolSlots
from hkv_core.manager.requests import RequestState, Table
from hkv_core.manager.roles.base import NO_DEMAND, Bools, Builder, Demand, Index, Moves
from hkv_core.manager.roles.tail import TailRole
from hkv_core.spec.names import Event


class StateRole(TailRole):
    """State-column page pools, each a one-object column of the point table (matched, referred to and pinned
    against eviction as a tail snapshot)."""

    FIRES: tuple[Event, ...] = (Event.PUBLISH_PINNED,)

    # ---------------------------------------------------------- match / acquire (a tail's: one object per point)

    def partial(self, tokens: int) -> bool:
        return any(tokens % pool.spec.tokens_per_page for pool in self.pools)

    def seed(self, req: RequestState, objs: list[Index]) -> None:
        for pool, got in zip(self.pools, objs, strict=True):
            column = (req.hit_tokens - 1) // pool.spec.tokens_per_page if got.size else 0
            pad = np.zeros(column, np.int32)
            req.tables[pool.index] = Table(np.concatenate([pad, got]), np.concatenate([pad, self.objects.slot[got]]))
            req.window_floor[pool.index] = column

    # ---------------------------------------------------------- allocate

    def demands(self, req: RequestState, start: int, end: int, boundaries: list[int]) -> list[Demand]:
        out = []
        for pool in self.pools:
            tokens = pool.spec.tokens_per_page
            last = (end - 1) // tokens
            # one entry: whole once a commit passes its first token (a copy's target: once past what it copies)
            new, snap = self._writes_new(req, pool, last), self._snapshot_due(req, pool, start, end)
            first = np.array([last * tokens + 1] * new + [start] * snap, np.int64)
            full = np.array([max(last * tokens + 1, req.computed + 1)] * new + [start] * snap, np.int64)
            out.append((len(first), first, full) if len(first) else NO_DEMAND)
        return out

    def _writes_new(self, req: RequestState, pool: PoolSlots, last: int) -> bool:
        """Whether a step ending in column `last` takes a page for it: a column the table lacks, or one the request
        may not write (a hit's page, or its own page that a point inside the column refers to: copied on write)."""
        table = req.tables[pool.index]
        return last >= len(table) or not self.owned(req, np.array([table[last]]))[0]

    def _snapshot_due(self, req: RequestState, pool: PoolSlots, start: int, end: int) -> bool:
        """Whether an allocation [start, end) takes a snapshot page for a pending point at `start` inside a column
        (of the prompt, or its junction) that the step then overwrites: the engine's step begins at `start` (its
        copies run first, while the column holds the state there) and ends in start's column."""
        tokens = pool.spec.tokens_per_page
        col = (start - 1) // tokens
        return bool(start % tokens and req.step_start == start > req.computed and start in req.pending_points
                    and (start <= req.prompt_tokens or start == req.junction_tokens)
                    and (end - 1) // tokens == col and col < len(req.tables[pool.index])
                    and self.owned(req, np.array([req.tables[pool.index][col]]))[0])

    def place(self, req: RequestState, start: int, end: int, boundaries: list[int], got: list[Index],
              out: Builder) -> None:
        for pool, objs in zip(self.pools, got, strict=True):
            table, tokens, slot = req.tables[pool.index], pool.spec.tokens_per_page, self.objects.slot
            last, whole = (end - 1) // tokens, [m.entries_per_page for m in pool.spec.members]
            taken = objs.tolist()
            if taken and self._writes_new(req, pool, last):
                obj = taken.pop(0)
                if last < len(table):  # copy on write: the step starts from the column's state
                    out.copy(self.objects, pool, int(table[last]), obj, whole)
                    table.put(last, obj, int(slot[obj]))
                else:  # the column of the last token; those the allocation skips stay NULL
                    pad = np.zeros(last - len(table), np.int32)
                    table.extend(np.concatenate([pad, [obj]]).astype(np.int32),
                                 np.concatenate([pad, [slot[obj]]]).astype(np.int32))
            if taken:  # a snapshot of the column at `start`, copied before the step overwrites it
                out.copy(self.objects, pool, int(table[(start - 1) // tokens]), taken[0], whole)
                req.snapshots.setdefault(pool.index, []).append(taken[0])
                req.snapshot_points.setdefault(pool.index, []).append(start)
            out.share(pool, out.tables, table.page_view())

    def draft_demands(self, req: RequestState, start: int, end: int, boundaries: list[int]) -> list[Demand]:
        raise InvalidRequestState(request_id=req.rid, action="allocate_draft",
                                  reason=f"speculative steps over state columns ({self.pools[0].name}) are not "
                                         "served")

    # ---------------------------------------------------------- commit

    def _columns(self, pool: PoolSlots, req: RequestState, due: NDArray[np.int64]) -> tuple[NDArray[np.int32], Bools]:
        """Per due point, the object of its column (NULL_OBJECT past the table) and whether the request owns it."""
        table, tokens = req.tables[pool.index].view(), pool.spec.tokens_per_page
        cols = (due - 1) // tokens
        inside = (cols >= 0) & (cols < len(table))
        objs = np.full(len(due), NULL_OBJECT, np.int32)
        objs[inside] = table[cols[inside]]
        return objs, inside & self.owned(req, objs)

    def _snapshots(self, pool: PoolSlots, req: RequestState, due: NDArray[np.int64]) -> NDArray[np.int32]:
        """Per due point, its snapshot page (NULL_OBJECT: none)."""
        found = dict(zip(req.snapshot_points.get(pool.index, []), req.snapshots.get(pool.index, []), strict=True))
        return np.array([found.get(int(t), NULL_OBJECT) for t in due.tolist()], np.int32)

    def points_ready(self, req: RequestState, due: NDArray[np.int64], moves: Moves) -> Bools:
        """A point at the commit's end (where the engine's step ended) on the request's own column page, or inside
        a column on its snapshot."""
        ok: Bools = np.ones(len(due), np.bool_)
        at_end = due == req.computed
        for pool in self.pools:
            inside = (due % pool.spec.tokens_per_page) != 0
            if np.any(inside) and not self.shared.config.allow_partial_page_copy:
                ok &= ~inside
            ok &= (at_end & self._columns(pool, req, due)[1]) | (inside & ~at_end
                                                                 & (self._snapshots(pool, req, due) != NULL_OBJECT))
        return ok

    def take_points(self, req: RequestState, due: NDArray[np.int64], keep: Bools,
                    moves: Moves) -> list[NDArray[np.int32]]:
        out = []
        at_end = due == req.computed
        for pool in self.pools:
            snaps = self._snapshots(pool, req, due)
            on_snap = keep & ~at_end & (snaps != NULL_OBJECT)
            objs = np.where(on_snap, snaps, self._columns(pool, req, due)[0])
            moves.add(Event.PUBLISH_PINNED, objs[keep & ~on_snap].astype(np.intp))  # the next step copies from it
            moves.add(Event.PUBLISH, objs[on_snap].astype(np.intp))
            moves.add(Event.ABORT, snaps[~on_snap & (snaps != NULL_OBJECT)].astype(np.intp))
            self._forget_snapshots(pool, req, due)
            out.append(objs[keep][:, None])
        return out

    def _forget_snapshots(self, pool: PoolSlots, req: RequestState, due: NDArray[np.int64]) -> None:
        """The due points' snapshots are kept or given back: the request lists them no longer."""
        points, objs = req.snapshot_points.get(pool.index, []), req.snapshots.get(pool.index, [])
        if points:
            gone = set(due.tolist())
            req.snapshots[pool.index] = [o for t, o in zip(points, objs, strict=True) if t not in gone]
            req.snapshot_points[pool.index] = [t for t in points if t not in gone]

    def slide(self, req: RequestState, pending: list[int], moves: Moves) -> None:
        """Give back the columns before the one holding the state at the request's position."""
        for pool in self.pools:
            self.release_below(req, pool, max(0, req.computed - 1) // pool.spec.tokens_per_page, moves)

    def finish(self, req: RequestState, moves: Moves) -> None:
        for pool in self.pools:
            pending = np.array(req.snapshots.pop(pool.index, []), np.int32)
            req.snapshot_points.pop(pool.index, None)
            self.give_back(req, np.concatenate([req.tables[pool.index].view(), pending]), moves)

    def audit(self, req: RequestState) -> list[str]:
        out = []
        for pool in self.pools:
            table, column = req.tables[pool.index].view(), (req.computed - 1) // pool.spec.tokens_per_page
            if req.computed > req.hit_tokens and (column >= len(table) or table[column] == NULL_OBJECT):
                out.append(f"request {req.rid} lacks the {pool.name} column holding its state at {req.computed}")
        return out
