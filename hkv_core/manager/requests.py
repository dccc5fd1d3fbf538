"""Requests in flight: tokens, keys, watermarks, chains, per-pool tables and leases.

A live request occupies one of `max_requests` slots; the slot is the actor
id the page pools record as an object's owner, and `committed[slot]` (the
tokens the request has committed) is the data the `rows_full` / `has_rows`
guards read; `known[slot]` (its known tokens) is what `tokens_known` reads.  Only the verbs change a request.
"""

from __future__ import annotations

import heapq
from typing import overload

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.block_keys import ExtraKeys
from hkv_core.manager.id_list import IdList, appended

NO_SLOT = -1


class PinList:
    """The objects a request's lease lists (of every page pool), and the version each had when pinned.

    Kept as chunks (one per pinning call) and joined only when read, so a
    pin costs a list append; `objs` / `versions` are the joined arrays.
    """

    __slots__ = ("_objs", "_versions")

    def __init__(self, objs: list[NDArray[np.intp]] | None = None,
                 versions: list[NDArray[np.int64]] | None = None) -> None:
        self._objs = objs or []
        self._versions = versions or []

    def add(self, objs: NDArray[np.integer], versions: NDArray[np.int64]) -> None:
        if objs.size:
            self._objs.append(objs.astype(np.intp, copy=False))
            self._versions.append(versions)

    def _joined(self) -> None:
        if len(self._objs) > 1:
            self._objs = [np.concatenate(self._objs)]
            self._versions = [np.concatenate(self._versions)]

    @property
    def objs(self) -> NDArray[np.intp]:
        self._joined()
        return self._objs[0] if self._objs else np.zeros(0, np.intp)

    @property
    def versions(self) -> NDArray[np.int64]:
        self._joined()
        return self._versions[0] if self._versions else np.zeros(0, np.int64)

    def remove(self, drop: NDArray[np.bool_]) -> None:
        """Forget the entries where `drop` (aligned with `objs`) is True."""
        objs, versions = self.objs, self.versions
        self._objs, self._versions = [objs[~drop]], [versions[~drop]]

    def clear(self) -> None:
        self._objs, self._versions = [], []

    def copy(self) -> PinList:
        return PinList(list(self._objs), list(self._versions))  # chunks are never written in place


class Table:
    """A request's table in one page pool: an object per page index (prefix) or per block (window), or its
    working tail; with the device page of each, kept in step, so an allocation hands out the page table
    as it is (a read-only view, no copy: a decode step costs the same at any context)."""

    __slots__ = ("objs", "pages")

    def __init__(self, objs: NDArray[np.integer] | None = None, pages: NDArray[np.integer] | None = None) -> None:
        self.objs = IdList() if objs is None else IdList(objs)
        self.pages = IdList() if pages is None else IdList(pages)

    def __len__(self) -> int:
        return len(self.objs)

    def __bool__(self) -> bool:
        return len(self.objs) > 0

    @overload
    def __getitem__(self, key: int) -> int: ...

    @overload
    def __getitem__(self, key: slice) -> NDArray[np.int32]: ...

    def __getitem__(self, key: int | slice) -> int | NDArray[np.int32]:
        return self.objs[key]

    def view(self) -> NDArray[np.int32]:
        return self.objs.view()

    def page_view(self) -> NDArray[np.int32]:
        """The pages, read-only (valid until the next call that changes this table)."""
        found = self.pages.view()
        found.setflags(write=False)
        return found

    def extend(self, objs: NDArray[np.integer], pages: NDArray[np.integer]) -> None:
        self.objs.extend(objs)
        self.pages.extend(pages)

    def put(self, index: int, obj: int, page: int) -> None:
        self.objs[index] = obj
        self.pages[index] = page

    def truncate(self, length: int) -> None:
        """Keep the first `length` entries (a speculative step's pages that were not accepted go)."""
        self.objs.truncate(length)
        self.pages.truncate(length)

    def clear(self, lo: int, hi: int) -> None:
        """Entries [lo, hi) released: NULL object and page."""
        self.objs[lo:hi] = 0
        self.pages[lo:hi] = 0

    def copy(self) -> Table:
        twin = Table.__new__(Table)
        twin.objs, twin.pages = self.objs.copy(), self.pages.copy()
        return twin


@attrs.define(kw_only=True)
class DraftState:
    """A speculative step in flight: tokens [start, verified) are verified, `tokens` follow them unverified.

    Everything the step reserved is DRAFT, owned by the request and out of
    the index's sight: `table_lens[pool]` is each table's length before the
    step (window and prefix pages it added come after), `segments[pool]` the
    tail pages (one per range of accepted lengths with the same tail rows:
    `(last accepted end of each, its object)`), `snapshots[pool]` one page per
    retained boundary of the step (`boundaries`), `blocks` / `points` the
    index rows it reserved, `plan` its checkpoint copy.  The request's working
    tail is never written by a step: it stays the checkpoint a rejection
    returns to.
    """

    start: int
    verified: int
    tokens: NDArray[np.int64]
    table_lens: list[int]
    segments: dict[int, list[tuple[int, int]]]
    snapshots: dict[int, list[int]]
    boundaries: list[int]
    blocks: int
    points: int
    plan: int = -1  # the checkpoint copy's plan (-1: none)

    @property
    def end(self) -> int:
        """The speculative watermark: verified tokens and the draft's."""
        return self.verified + len(self.tokens)

    def objects(self, tables: list[Table]) -> list[int]:
        """Every DRAFT object of the step (table pages it added, tail segments, snapshot pages)."""
        found = [obj for pool, n in enumerate(self.table_lens) for obj in tables[pool].objs[n:].tolist()]
        found += [obj for segs in self.segments.values() for _, obj in segs]
        return found + [obj for snaps in self.snapshots.values() for obj in snaps]

    def clone(self) -> DraftState:
        return attrs.evolve(self, table_lens=list(self.table_lens),
                            segments={p: list(s) for p, s in self.segments.items()},
                            snapshots={p: list(s) for p, s in self.snapshots.items()},
                            boundaries=list(self.boundaries))


@attrs.define(kw_only=True)
class RequestState:
    """One request in flight (see docs/manager.md for the lifecycle of a request)."""

    rid: int
    slot: int
    tokens: NDArray[np.int64]
    keys: NDArray[np.uint64]
    extra: ExtraKeys
    prompt_tokens: int
    lanes: int
    computed: int = 0
    allocated: int = 0
    hit_tokens: int = 0
    junction_tokens: int = 0  # where its prompt leaves the longest cached chain, past its hit (0: nowhere)
    acquired: bool = False
    chain: IdList = attrs.field(factory=IdList)  # block ids of blocks 0.. in the index
    tables: list[Table] = attrs.field(factory=list)  # per page pool: prefix page / window block / working tail
    pins: PinList = attrs.field(factory=PinList)  # what its lease lists (objects of every pool)
    window_floor: list[int] = attrs.field(factory=list)  # per page pool: window blocks below are released
    pending_points: list[int] = attrs.field(factory=list)  # boundaries allocated, not yet committed (ascending)
    snapshots: dict[int, list[int]] = attrs.field(factory=dict)  # tail pool -> snapshot objects, one per pending point
    snapshot_points: dict[int, list[int]] = attrs.field(factory=dict)  # state pool -> the point of each snapshot
    tail_sources: dict[int, int] = attrs.field(factory=dict)  # tail pool -> the hit's snapshot object
    block_rows: int = 0  # index rows reserved for blocks its commits may add
    point_rows: int = 0  # index rows reserved for resume points its commits may keep
    plans: set[int] = attrs.field(factory=set)  # copy plans issued for it and not yet completed
    failed_plan: int = -1  # a copy plan that failed: its targets are unusable
    matched: tuple[int, object, NDArray[np.int32], int, list[NDArray[np.intp]]] | None = None  # match's last hit:
    # (page-pool generation, the Hit, its blocks, its point, its objects per pool)
    token_room: NDArray[np.int64] | None = None  # `tokens` is a prefix view of it while decoding
    key_room: NDArray[np.uint64] | None = None  # `keys` likewise
    draft: DraftState | None = None  # a speculative step between propose and accept / reject
    ahead: list[int] = attrs.field(factory=list)  # its AHEAD objects: reserved past its known tokens, unverified
    step_start: int = -1  # while an allocation runs: where the engine's step it serves begins (-1: not said)

    def __attrs_post_init__(self) -> None:
        if not self.tables:
            self.tables = [Table() for _ in range(self.lanes)]
            self.window_floor = [0] * self.lanes

    def extend(self, tokens: NDArray[np.int64], keys: NDArray[np.uint64]) -> None:
        """Append decoded tokens and their new block keys in amortized O(new) (no copy of the context)."""
        self.tokens, self.token_room = appended(self.tokens, self.token_room, tokens)
        self.keys, self.key_room = appended(self.keys, self.key_room, keys)

    def clone(self) -> RequestState:
        """Token and key arrays are copied: decoding appends in place into their room."""
        return attrs.evolve(self, tokens=self.tokens.copy(), keys=self.keys.copy(), token_room=None, key_room=None,
                            chain=self.chain.copy(), tables=[t.copy() for t in self.tables],
                            pins=self.pins.copy(), window_floor=list(self.window_floor),
                            pending_points=list(self.pending_points),
                            snapshots={p: list(o) for p, o in self.snapshots.items()},
                            snapshot_points={p: list(o) for p, o in self.snapshot_points.items()},
                            tail_sources=dict(self.tail_sources), plans=set(self.plans),
                            draft=self.draft.clone() if self.draft is not None else None, ahead=list(self.ahead))


class RequestTable:
    """Live requests by id and by slot; `committed` and `known` tokens per slot (one more entry: -1 for 'no
    owner')."""

    def __init__(self, max_requests: int) -> None:
        self.max_requests = max_requests
        self.committed = np.full(max_requests + 1, -1, np.int64)
        self.known = np.full(max_requests + 1, -1, np.int64)
        self.by_rid: dict[int, RequestState] = {}
        self.by_slot: list[RequestState | None] = [None] * max_requests
        self.free_slots = list(range(max_requests))  # a min-heap (heapq): the lowest free slot first
        self.next_rid = 0

    def __len__(self) -> int:
        return len(self.by_rid)

    def admit(self, make: type[RequestState], **fields: object) -> RequestState:
        """A new request in the lowest free slot (the caller checked the admission cap)."""
        slot = heapq.heappop(self.free_slots)
        req = make(rid=self.next_rid, slot=slot, **fields)  # type: ignore[arg-type]
        self.next_rid += 1
        self.by_rid[req.rid], self.by_slot[slot] = req, req
        self.committed[slot] = 0
        self.known[slot] = len(req.tokens)
        return req

    def forget(self, req: RequestState) -> None:
        del self.by_rid[req.rid]
        self.by_slot[req.slot] = None
        self.committed[req.slot] = -1
        self.known[req.slot] = -1
        heapq.heappush(self.free_slots, req.slot)  # O(log n): a release never sorts every slot

    def set_committed(self, req: RequestState, tokens: int) -> None:
        req.computed = tokens
        self.committed[req.slot] = tokens

    def set_known(self, req: RequestState) -> None:
        """The request's known tokens grew (append_tokens): what guard `tokens_known` reads."""
        self.known[req.slot] = len(req.tokens)

    def pinned(self, slot: int) -> NDArray[np.intp]:
        """The objects request `slot`'s lease lists."""
        req = self.by_slot[slot] if 0 <= slot < self.max_requests else None
        return req.pins.objs if req is not None else np.zeros(0, np.intp)

    def chain_tails(self) -> NDArray[np.int32]:
        """The last block of every live request's chain."""
        tails = [r.chain[-1] for r in self.by_rid.values() if r.chain]
        return np.array(tails, np.int32)

    def live(self) -> list[RequestState]:
        return list(self.by_rid.values())

    def clone(self) -> RequestTable:
        twin = RequestTable.__new__(RequestTable)
        twin.max_requests, twin.next_rid = self.max_requests, self.next_rid
        twin.committed = self.committed.copy()
        twin.known = self.known.copy()
        twin.by_rid = {rid: r.clone() for rid, r in self.by_rid.items()}
        twin.by_slot = [None if r is None else twin.by_rid[r.rid] for r in self.by_slot]
        twin.free_slots = list(self.free_slots)
        return twin
