"""PrefixRole: compressed KV and indexer keys, read over entries j < P // r by a resume point at P.

A prefix page covers `tokens_per_page` tokens (a whole number of blocks); the
index refers to it from every block of its span.  A resume point inside a
page reads the page's first entries, copied on write into the request's own
page (`PARTIAL_PAGE_COPY`).  A request publishes a page when it completes
(or, at release, the page it stopped in, sealed with the rows written: so a
conversation resumes at its last retained point, not only at page ends), and
references it from the blocks of its span that have none; a page whose blocks
all have one already stays private and is given back at release.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from hkv_core.arrays import all_true, any_nonzero
from hkv_core.manager.index.blocks import Attach
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


class PrefixRole(Role):
    """Prefix page pools, each a column of the block table."""

    FIRES = (Event.FILL, Event.COPY_DONE, Event.COPY_FAIL, Event.SEAL, Event.PUBLISH, Event.PUBLISH_PINNED)

    def __init__(self, shared: Shared, pools: tuple[PoolSlots, ...], first_column: int) -> None:
        super().__init__(shared, pools, first_column)
        self.span = [p.spec.tokens_per_page // self.bt for p in pools]  # blocks per page
        self.ratio = [max(1, p.spec.compress_ratio) for p in pools]
        self.lcm_tokens = math.lcm(self.bt, *(p.spec.tokens_per_page for p in pools))
        self._offsets = [np.arange(n) for n in self.span]  # block offsets inside a page's span
        empty = (np.zeros(0, np.int64), np.zeros(0, np.bool_))
        self._cache: list[tuple[NDArray[np.int64], NDArray[np.bool_]]] = [empty for _ in pools]
        self._last_ends: tuple[int, list[Index]] = (-1, [])  # hit_objects' last (blocks, ends per pool)

    def _objects(self, ids: NDArray[np.integer], i: int) -> NDArray[np.int32]:
        return self.shared.index.blocks.objects(ids, self.columns[i])

    def pages_needed(self, i: int, blocks: NDArray[np.int64]) -> NDArray[np.int64]:
        """Pages of pool i a resume point after `blocks` blocks reads: entries j < P // r only."""
        spec = self.pools[i].spec
        entries = blocks * self.bt // self.ratio[i]
        return np.asarray(-(-entries // spec.entries_per_page))

    def _geometry(self, i: int, top: int) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
        """Per candidate b in [0, top]: whole pages read at b, and whether b reads no partial page
        (static per pool: cached and grown by doubling)."""
        whole, exact = self._cache[i]
        if len(whole) <= top:
            b = np.arange(max(2 * len(whole), top + 1))
            need, full = self.pages_needed(i, b), b // self.span[i]
            whole, exact = np.minimum(need, full), need <= full
            self._cache[i] = (whole, exact)
        return whole, exact

    # ---------------------------------------------------------- match / acquire

    def conditions(self, ids: NDArray[np.int32], lo: int) -> list[Condition]:
        """Every page needed at b is indexed: whole pages at their span's last block, a partial one at b - 1."""
        n, out = len(ids), []
        for i, pool in enumerate(self.pools):
            whole, exact = self._geometry(i, n)
            ok = self._objects(ids, i) != NULL_OBJECT
            bad = np.flatnonzero(~ok[self.span[i] - 1::self.span[i]])  # whole pages missing at their last block
            good = int(bad[0]) if bad.size else n  # pages present from page 0 on
            previous = np.empty(n + 1 - lo, np.bool_)  # block b - 1 has the partial page
            previous[lo == 0:] = ok[max(lo, 1) - 1:]
            previous[0] |= lo == 0
            usable = (whole[lo:n + 1] <= good) & (exact[lo:n + 1] | previous)
            out.append(("multi_group", MISSING_CODE[pool.spec.kind], pool.name, usable))
        if not self.shared.config.allow_partial_page_copy:
            b = np.arange(lo, n + 1)
            out.append(("whole_block", "LCM_ROUNDED", f"lcm={self.lcm_tokens}", b * self.bt % self.lcm_tokens == 0))
        return out

    def hit_objects(self, ids: NDArray[np.int32], point: int) -> list[Index]:
        b, out = len(ids), []
        ends = self._ends(b)
        for i in range(len(self.pools)):
            out.append(self._objects(ids[ends[i]].astype(np.intp), i).astype(np.intp))
        return out

    def _ends(self, b: int) -> list[Index]:
        """Per pool: the block whose entry holds each page a hit after `b` blocks reads (the last block of
        each whole page, the hit's last block for a partial one); the last answer is remembered."""
        if self._last_ends[0] == b:
            return self._last_ends[1]
        found = []
        for i, pool in enumerate(self.pools):
            per_page = self.span[i]
            need = -(-(b * self.bt // self.ratio[i]) // pool.spec.entries_per_page)
            ends = np.arange(per_page - 1, need * per_page, per_page)
            if need and need * per_page > b:
                ends[-1] = b - 1  # the partial page, at the hit's last block
            ends.setflags(write=False)
            found.append(ends)
        self._last_ends = (b, found)
        return found

    def partial(self, tokens: int) -> bool:
        return any((tokens // r) % p.spec.entries_per_page for p, r in zip(self.pools, self.ratio, strict=True))

    def seed(self, req: RequestState, objs: list[Index]) -> None:
        for pool, got in zip(self.pools, objs, strict=True):
            req.tables[pool.index] = Table(got, self.objects.slot[got])

    # ---------------------------------------------------------- allocate

    def _cow(self, pool: PoolSlots, req: RequestState, start: int) -> int:
        """The page index that must be copied on write before writing at `start`, or -1."""
        table, first = req.tables[pool.index], start // pool.spec.tokens_per_page
        if first < len(table) and self.objects.owner[table[first]] != req.slot:
            return first
        return -1

    def demands(self, req: RequestState, start: int, end: int, boundaries: list[int]) -> list[Demand]:
        out = []
        for i, pool in enumerate(self.pools):
            tpp, have = pool.spec.tokens_per_page, len(req.tables[pool.index])
            last, cow = (end - 1) // tpp + 1, self._cow(pool, req, start)
            if last <= have and cow < 0:  # a decode step inside a page it owns: nothing new
                out.append(NO_DEMAND)
                continue
            pages = np.arange(have, last)
            if cow >= 0:
                pages = np.concatenate([[cow], pages])
            out.append((len(pages), pages * tpp + self.ratio[i], (pages + 1) * tpp))
        return out

    def place(self, req: RequestState, start: int, end: int, boundaries: list[int], got: list[Index],
              out: Builder) -> None:
        for i, (pool, objs) in enumerate(zip(self.pools, got, strict=True)):
            table = req.tables[pool.index]
            cow = self._cow(pool, req, start)
            if cow >= 0:
                entries = (req.hit_tokens - cow * pool.spec.tokens_per_page) // self.ratio[i]
                out.copy(self.objects, pool, table[cow], int(objs[0]), [entries] * len(pool.spec.members))
                table.put(cow, int(objs[0]), int(self.objects.slot[objs[0]]))
                objs = objs[1:]
            if objs.size:
                table.extend(objs, self.objects.slot[objs])
            self._describe(i, pool, req, start, end, out)

    def _describe(self, i: int, pool: PoolSlots, req: RequestState, start: int, end: int, out: Builder) -> None:
        """Block table and slots of tokens [start, end) (one array shared by the member pools)."""
        r = self.ratio[i]
        pages = req.tables[pool.index].page_view()
        out.share(pool, out.tables, pages)  # entries the tokens complete: [(start + r) // r - 1, end // r)
        out.share(pool, out.slots, slots_of(pages, pool.spec.entries_per_page, (start + r) // r - 1, end // r))

    # ---------------------------------------------------------- commit / release

    def completed(self, req: RequestState, before: int, moves: Moves) -> None:
        """Each page this commit completed goes to the blocks of its span that lack one (published, pinned)."""
        for i, pool in enumerate(self.pools):
            tpp = pool.spec.tokens_per_page
            first, table = before // tpp, req.tables[pool.index]
            objs = table[first:req.computed // tpp].astype(np.intp)
            owned = self.owned(req, objs)
            if all_true(owned):  # every page new (the usual case): no gather
                if objs.size and self._fresh(i, req, objs, first, moves):
                    continue
                pages = np.arange(first, first + objs.size)
            else:
                pages = owned.nonzero()[0] + first
                objs = objs[owned]
            if not objs.size:
                continue
            used, update = self._spans(i, req, objs, pages)
            if used.size:
                moves.add(Event.PUBLISH_PINNED, used)
                moves.attach.append(update)

    def _fresh(self, i: int, req: RequestState, objs: Index, first: int, moves: Moves) -> bool:
        """The usual commit: pages first.. (all the request's own) whose spans lie inside the chain and whose
        blocks all lack an object of pool i: every block of each span gets its page (what `_spans` finds,
        from one slice of the chain).  False, nothing planned, otherwise."""
        per_page, chain = self.span[i], req.chain.view()
        lo, hi = first * per_page, (first + objs.size) * per_page
        if hi > len(chain):
            return False
        ids = chain[lo:hi].astype(np.intp)  # (an intp index gathers faster than int32)
        if any_nonzero(self._objects(ids, i)):  # some block has one already (NULL_OBJECT is 0)
            return False
        moves.add(Event.PUBLISH_PINNED, objs)
        counts = None if per_page == 1 else np.full(objs.size, per_page, np.intp)
        moves.attach.append((self.columns[i], ids, objs if per_page == 1 else np.repeat(objs, per_page), objs, counts))
        return True

    def _spans(self, i: int, req: RequestState, objs: Index, pages: Index) -> tuple[Index, Attach]:
        """Which of `objs` (pages `pages` of the request) some block of their span lacks, and the attach."""
        per_page, chain = self.span[i], req.chain.view()
        if per_page == 1 and pages[-1] < len(chain):  # one block per page (the shortest pages): no spans
            ids = chain[pages]
            lacking = self._objects(ids, i) == NULL_OBJECT
            used = objs[lacking]
            return used, (self.columns[i], ids[lacking].astype(np.intp), used, used, None)
        spans = pages[:, None] * per_page + self._offsets[i]  # (pages, blocks of a span)
        inside = spans < len(chain)  # a sealed page covers only the blocks its rows complete
        ids = chain[np.minimum(spans, len(chain) - 1)]
        lacking = inside & (self._objects(ids, i) == NULL_OBJECT)
        counts = np.count_nonzero(lacking, axis=1)
        used = counts > 0
        return objs[used], (self.columns[i], ids[lacking].astype(np.intp), np.repeat(objs, counts), objs[used],
                            counts[used].astype(np.intp))

    def finish(self, req: RequestState, moves: Moves) -> None:
        for i, pool in enumerate(self.pools):
            table = req.tables[pool.index].view()
            sealed = self._keep_partial(i, pool, req, moves)
            self.give_back(req, table if sealed < 0 else table[table != sealed], moves)

    def _keep_partial(self, i: int, pool: PoolSlots, req: RequestState, moves: Moves) -> int:
        """Seal and publish the page the request stopped in, if it holds rows some committed block lacks;
        returns the object (NULL_OBJECT when none)."""
        table, page = req.tables[pool.index], req.computed // pool.spec.tokens_per_page
        if page >= len(table) or req.computed // self.bt <= page * self.span[i]:
            return NULL_OBJECT
        obj = table[page]
        o = self.objects
        if o.owner[obj] != req.slot or req.computed < o.row_token[obj] or not o.reserved[o.code[obj]]:
            return NULL_OBJECT
        used, update = self._spans(i, req, np.array([obj], np.intp), np.array([page], np.intp))
        if not used.size:
            return NULL_OBJECT
        moves.add(Event.SEAL, used)
        moves.attach.append(update)
        return obj

    def audit(self, req: RequestState) -> list[str]:
        out = []
        for i, pool in enumerate(self.pools):
            need = int(self.pages_needed(i, np.array([req.computed // self.bt]))[0])
            table = req.tables[pool.index].view()
            if len(table) < need or np.any(table[:need] == NULL_OBJECT):
                out.append(f"request {req.rid} lacks {pool.name} pages its {req.computed} tokens need")
        return out

    # ---------------------------------------------------------- eviction

    def blocks_pinned(self, blocks: NDArray[np.int32]) -> Bools:
        pinned = np.zeros(len(blocks), np.bool_)
        for i in range(len(self.pools)):
            pinned |= self.objects.leases[self._objects(blocks, i)] > 0  # the NULL object is never pinned
        return pinned

    def refs(self, points: NDArray[np.int32], point_pos: Index, blocks: NDArray[np.int32],
             block_pos: Index) -> list[tuple[NDArray[np.int32], Index]]:
        return [(self._objects(blocks, i), block_pos) for i in range(len(self.pools))]
