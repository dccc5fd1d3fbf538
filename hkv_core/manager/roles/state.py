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

    def seed(self, req: RequestState, objs: list[Index]) -> None:
        for pool, got in zip(self.pools, objs, strict=True):
            column = req.hit_tokens // pool.spec.tokens_per_page - 1 if got.size else 0
            pad = np.zeros(column, np.int32)
            req.tables[pool.index] = Table(np.concatenate([pad, got]), np.concatenate([pad, self.objects.slot[got]]))
            req.window_floor[pool.index] = column

    # ---------------------------------------------------------- allocate

    def demands(self, req: RequestState, start: int, end: int, boundaries: list[int]) -> list[Demand]:
        out = []
        for pool in self.pools:
            tokens = pool.spec.tokens_per_page
            last = (end - 1) // tokens
            if last < len(req.tables[pool.index]):
                out.append(NO_DEMAND)
                continue
            out.append((1, np.array([last * tokens + 1], np.int64), np.array([(last + 1) * tokens], np.int64)))
        return out

    def place(self, req: RequestState, start: int, end: int, boundaries: list[int], got: list[Index],
              out: Builder) -> None:
        for pool, objs in zip(self.pools, got, strict=True):
            table = req.tables[pool.index]
            if objs.size:  # the column of the last token; those the allocation skips stay NULL
                skipped = (end - 1) // pool.spec.tokens_per_page - len(table)
                pad = np.zeros(skipped, np.int32)
                table.extend(np.concatenate([pad, objs]), np.concatenate([pad, self.objects.slot[objs]]))
            out.share(pool, out.tables, table.page_view())

    def draft_demands(self, req: RequestState, start: int, end: int, boundaries: list[int]) -> list[Demand]:
        raise InvalidRequestState(request_id=req.rid, action="allocate_draft",
                                  reason=f"speculative steps over state columns ({self.pools[0].name}) are not "
                                         "served")

    # ---------------------------------------------------------- commit

    def _columns(self, pool: PoolSlots, req: RequestState, due: NDArray[np.int64]) -> tuple[NDArray[np.int32], Bools]:
        """Per due point, the object of its column (NULL_OBJECT past the table) and whether the request owns it."""
        table, tokens = req.tables[pool.index].view(), pool.spec.tokens_per_page
        cols = due // tokens - 1
        inside = (cols >= 0) & (cols < len(table))
        objs = np.full(len(due), NULL_OBJECT, np.int32)
        objs[inside] = table[cols[inside]]
        return objs, inside & self.owned(req, objs)

    def points_ready(self, req: RequestState, due: NDArray[np.int64], moves: Moves) -> Bools:
        """A point only at the commit's end (where the engine's step ended) on a block boundary, its column the
        request's own page."""
        ok: Bools = due == req.computed
        for pool in self.pools:
            ok &= (due % pool.spec.tokens_per_page == 0) & self._columns(pool, req, due)[1]
        return ok

    def take_points(self, req: RequestState, due: NDArray[np.int64], keep: Bools,
                    moves: Moves) -> list[NDArray[np.int32]]:
        out = []
        for pool in self.pools:
            objs = self._columns(pool, req, due)[0][keep]
            moves.add(Event.PUBLISH_PINNED, objs.astype(np.intp))  # the request's next step copies from it
            out.append(objs[:, None])
        return out

    def slide(self, req: RequestState, pending: list[int], moves: Moves) -> None:
        """Give back the columns before the one holding the state at the request's position."""
        for pool in self.pools:
            self.release_below(req, pool, max(0, req.computed - 1) // pool.spec.tokens_per_page, moves)

    def finish(self, req: RequestState, moves: Moves) -> None:
        for pool in self.pools:
            self.give_back(req, req.tables[pool.index].view(), moves)

    def audit(self, req: RequestState) -> list[str]:
        out = []
        for pool in self.pools:
            table, column = req.tables[pool.index].view(), (req.computed - 1) // pool.spec.tokens_per_page
            if req.computed > req.hit_tokens and (column >= len(table) or table[column] == NULL_OBJECT):
                out.append(f"request {req.rid} lacks the {pool.name} column holding its state at {req.computed}")
        return out
