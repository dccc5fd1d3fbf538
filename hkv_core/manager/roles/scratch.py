"""ScratchRole: one page per request for the request's life, read and written by that request only.

An engine's compressor ring (vLLM's `CircularBufferSpec`, DeepSeek-V4.1's
compressor state): the last few rows a compressor reads back, written by
the request's own kernels before they are read (a hit needs nothing of it:
its resume points land where the ring holds nothing a later token reads).
The page is reserved at the request's first allocation and given back when
it ends; it is never published, indexed, leased or part of a resume point,
so no request ever reads another's ring.
"""

from __future__ import annotations

import numpy as np

from hkv_core.manager.requests import DraftState, RequestState
from hkv_core.manager.roles.base import NEVER_FULL, NO_DEMAND, Builder, Demand, Index, Moves, Role

ONE_PAGE: Demand = (1, np.array([NEVER_FULL], np.int64), np.array([NEVER_FULL], np.int64))  # never complete


class ScratchRole(Role):
    """Scratch page pools: one private page per request."""

    def demands(self, req: RequestState, start: int, end: int, boundaries: list[int]) -> list[Demand]:
        return [NO_DEMAND if req.tables[pool.index] else ONE_PAGE for pool in self.pools]

    def place(self, req: RequestState, start: int, end: int, boundaries: list[int], got: list[Index],
              out: Builder) -> None:
        for pool, objs in zip(self.pools, got, strict=True):
            table = req.tables[pool.index]
            if objs.size:
                table.extend(objs, self.objects.slot[objs])
            out.share(pool, out.tables, table.page_view())

    def settle_draft(self, req: RequestState, draft: DraftState, end: int, moves: Moves) -> None:
        """A speculative step keeps the scratch page: it is the request's whatever the step's outcome."""

    def finish(self, req: RequestState, moves: Moves) -> None:
        for pool in self.pools:
            self.give_back(req, req.tables[pool.index].view(), moves)

    def audit(self, req: RequestState) -> list[str]:
        o = self.objects
        return [f"request {req.rid} computes without its own {pool.name} page" for pool in self.pools
                if req.allocated > req.hit_tokens and (len(req.tables[pool.index]) != 1
                                                       or o.owner[req.tables[pool.index][0]] != req.slot)]
