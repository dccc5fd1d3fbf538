"""Role: what one kind of page pool is to a resume point, and everything the verbs ask of it.

There are three roles (prefix, window, tail); each owns its page pools and
answers, for them only: what a resume point at P needs (match's conditions),
which objects a hit there reads, what a request's next tokens need and where
they go, what a commit completed, what a kept point refers to, what a
request gives back, and what eviction drops.  The verbs ask every role in
turn and never ask which role they hold: there is no `if role is ...` outside
the role classes.

Roles plan; the verbs apply: a role returns the objects that must move (into
a `Moves`), and the verb fires each event once over the objects of every
role and pool (one lifecycle step per event, whatever the number of pools).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.layout import Layout
from hkv_core.manager.config import ManagerConfig
from hkv_core.manager.index import PrefixIndex
from hkv_core.manager.index.blocks import Attach
from hkv_core.manager.page_pools import NULL_OBJECT, PagePools, PoolSlots
from hkv_core.manager.requests import DraftState, RequestState, RequestTable
from hkv_core.plan import CopyPages
from hkv_core.spec.names import Event

Index = NDArray[np.intp]
Bools = NDArray[np.bool_]
Tokens = NDArray[np.int64]
Demand = tuple[int, Tokens, Tokens]  # (objects, row token of each, full token of each)
Condition = tuple[str, str, str, Bools]  # (layer, reason code, where, usable at b = lo..n)
MISSING_CODE = {"compressed_kv": "COMPRESSED_MISSING", "indexer_state": "INDEXER_MISSING",
                "compressor_tail": "TAIL_MISSING", "swa_window": "WINDOW_MISSING",
                "recurrent_state": "RECURRENT_MISSING"}
NEVER_FULL = np.iinfo(np.int64).max  # full_token of a page no commit completes (a working tail)
NO_DEMAND: Demand = (0, np.zeros(0, np.int64), np.zeros(0, np.int64))


@attrs.frozen(kw_only=True)
class Shared:
    """What every role reads besides its own pools."""

    objects: PagePools
    index: PrefixIndex
    requests: RequestTable
    layout: Layout
    config: ManagerConfig

    @property
    def block_tokens(self) -> int:
        return self.layout.block_tokens


@attrs.define
class Builder:
    """An Allocation under construction: tables, slots, tail pages, snapshots, copies and their targets."""

    tables: dict[str, NDArray[np.int32]] = attrs.field(factory=dict)
    slots: dict[str, NDArray[np.int64]] = attrs.field(factory=dict)
    tail_pages: dict[str, int] = attrs.field(factory=dict)
    snapshots: dict[int, dict[str, int]] = attrs.field(factory=dict)
    draft_tails: dict[int, dict[str, int]] = attrs.field(factory=dict)  # accepted end E -> page of the tail at E
    copies: list[CopyPages] = attrs.field(factory=list)
    fills: list[int] = attrs.field(factory=list)  # objects the copies write (FILLING until completed)

    def copy(self, objects: PagePools, pool: PoolSlots, src: int, dst: int, entries: Sequence[int]) -> None:
        """Copy the first entries[m] entries of object `src` into object `dst`, in each member pool m."""
        src_page, dst_page, version = int(objects.slot[src]), int(objects.slot[dst]), int(objects.version[src])
        ops = [CopyPages(pool=m.name, src=src_page, dst=dst_page, entries=e, src_version=version)
               for m, e in zip(pool.spec.members, entries, strict=True) if e]
        if ops:
            self.copies += ops
            self.fills.append(dst)

    def share(self, pool: PoolSlots, into: dict[str, NDArray[np.int64]] | dict[str, NDArray[np.int32]],
              value: NDArray[np.int64] | NDArray[np.int32]) -> None:
        """The same array for every member pool (they share page ids)."""
        for member in pool.spec.members:
            into[member.name] = value  # type: ignore[assignment]


@attrs.define
class Moves:
    """Objects a verb moves once the roles planned: per event, the objects of every role and pool."""

    objs: dict[Event, list[Index]] = attrs.field(factory=dict)
    attach: list[Attach] = attrs.field(factory=list)
    point_holds: dict[int, tuple[Index, Index | None]] = attrs.field(factory=dict)  # column -> (objs, counts)
    spans: dict[int, tuple[NDArray[np.int32], Bools]] = attrs.field(factory=dict)  # window pool -> the due points'
    # window objects and coverage, as points_ready read them (take_points of the same commit reuses them)

    def add(self, event: Event, objs: Index) -> None:
        if objs.size:
            self.objs.setdefault(event, []).append(objs)

    def take(self, event: Event) -> Index:
        parts = self.objs.pop(event, [])
        return parts[0] if len(parts) == 1 else (np.concatenate(parts) if parts else np.zeros(0, np.intp))


class Role:
    """Base of the three roles: defaults for roles with nothing to say at some step."""

    FIRES: tuple[Event, ...] = ()  # events fired on this role's pools beyond every pool's (page_pools.FIRED)

    def __init__(self, shared: Shared, pools: tuple[PoolSlots, ...], first_column: int) -> None:
        self.shared, self.pools, self.objects = shared, pools, shared.objects
        self.columns = tuple(range(first_column, first_column + len(pools)))  # their index columns
        self.bt = shared.block_tokens

    # ---------------------------------------------------------- match / acquire

    def conditions(self, ids: NDArray[np.int32], lo: int) -> list[Condition]:
        """Per pool: is resume point b usable, for b in [lo, len(ids)]."""
        return []

    def hit_objects(self, ids: NDArray[np.int32], point: int) -> list[Index]:
        """Per pool: the objects a hit after blocks `ids`, at resume point `point`, reads."""
        return [np.zeros(0, np.intp) for _ in self.pools]

    def partial(self, tokens: int) -> bool:
        """Does a resume point at `tokens` read only part of one of this role's pages (copy on write)?"""
        return False

    def seed(self, req: RequestState, objs: list[Index]) -> None:
        """A request acquired a hit whose objects (per pool) are `objs`: its tables start from them."""

    # ---------------------------------------------------------- allocate

    def demands(self, req: RequestState, start: int, end: int, boundaries: list[int]) -> list[Demand]:
        """Per pool: the objects tokens [start, end) need (with `boundaries` the points they will keep)."""
        return [NO_DEMAND for _ in self.pools]

    def place(self, req: RequestState, start: int, end: int, boundaries: list[int], got: list[Index],
              out: Builder) -> None:
        """Put the objects reserved for `demands` (per pool) in the request's tables; say where tokens go."""

    # ---------------------------------------------------------- speculative steps (draft.py)

    def draft_demands(self, req: RequestState, start: int, end: int, boundaries: list[int]) -> list[Demand]:
        """Per pool: the DRAFT objects a speculative step over tokens [start, end) needs (by default what an
        allocation of those tokens needs: the pages past the request's table, written in place)."""
        return self.demands(req, start, end, [])

    def draft_place(self, req: RequestState, start: int, end: int, boundaries: list[int], got: list[Index],
                    out: Builder, draft: DraftState) -> None:
        """Put the step's DRAFT objects where it writes (by default appended to the request's tables)."""
        self.place(req, start, end, [], got, out)

    def settle_draft(self, req: RequestState, draft: DraftState, end: int, moves: Moves) -> None:
        """Tokens [draft.start, end) stay: ACCEPT the step's objects they use, REJECT the others (by default
        the table pages past those covering [0, end), which leave the table)."""
        for pool in self.pools:
            table, before = req.tables[pool.index], draft.table_lens[pool.index]
            keep = max(before, -(-end // pool.spec.tokens_per_page))  # pages covering tokens [0, end)
            added = table.objs[before:].astype(np.intp)
            moves.add(Event.ACCEPT, added[:keep - before])
            moves.add(Event.REJECT, added[keep - before:])
            table.truncate(min(keep, len(table)))

    # ---------------------------------------------------------- commit / release

    def completed(self, req: RequestState, before: int, moves: Moves) -> None:
        """Tokens [before, computed) were written: what to publish (PUBLISH_PINNED) and attach."""

    def points_ready(self, req: RequestState, due: NDArray[np.int64], moves: Moves) -> Bools | None:
        """Per due boundary: can a point be kept there with this role's objects?  None: at every one."""
        return None

    def take_points(self, req: RequestState, due: NDArray[np.int64], keep: Bools,
                    moves: Moves) -> list[NDArray[np.int32]]:
        """This role's objects of the points to keep (one matrix per pool); what to publish and give back."""
        return []

    def slide(self, req: RequestState, pending: list[int], moves: Moves) -> None:
        """What neither the request's position nor a pending point still needs (ABORT / UNPIN)."""

    def finish(self, req: RequestState, moves: Moves) -> None:
        """The request ends: what to keep for the index (SEAL, PUBLISH, attach) and give back (ABORT)."""

    def audit(self, req: RequestState) -> list[str]:
        """Invariant check: what the request must hold at its position, for this role (messages)."""
        return []

    # ---------------------------------------------------------- eviction

    def blocks_pinned(self, blocks: NDArray[np.int32]) -> Bools:
        """Per block: does a lease pin an object of this role that the block refers to?"""
        return np.zeros(len(blocks), np.bool_)

    def points_pinned(self, points: NDArray[np.int32]) -> Bools:
        """Per point: does a lease pin an object of this role that would make dropping the point useless?"""
        return np.zeros(len(points), np.bool_)

    def refs(self, points: NDArray[np.int32], point_pos: Index, blocks: NDArray[np.int32],
             block_pos: Index) -> list[tuple[NDArray[np.int32], Index]]:
        """(objects, position of the unit dropping each reference) for the units given, per pool."""
        return []

    # ---------------------------------------------------------- helpers shared by the roles

    def owned(self, req: RequestState, objs: NDArray[np.integer]) -> Bools:
        """Which of `objs` the request owns (RESERVED or READY, not yet published)."""
        mine: Bools = self.objects.owner[objs] == req.slot
        return mine

    def release_below(self, req: RequestState, pool: PoolSlots, top: int, moves: Moves) -> None:
        """Give back the request's table entries of `pool` from its floor up to `top` (ABORT what it owns, UNPIN
        what it pinned), NULL them and raise the floor (a window's or state columns' slide)."""
        table, floor = req.tables[pool.index], req.window_floor[pool.index]
        top = min(top, len(table))
        if top <= floor:
            return
        gone = table[floor:top].astype(np.intp)
        gone = gone[gone != NULL_OBJECT]
        mine = self.owned(req, gone)
        moves.add(Event.ABORT, gone[mine])
        moves.add(Event.UNPIN, gone[~mine])
        table.clear(floor, top)
        req.window_floor[pool.index] = top

    def give_back(self, req: RequestState, objs: NDArray[np.integer], moves: Moves) -> None:
        """Abort the objects of `objs` (distinct apart from NULL entries) the request still owns."""
        moves.add(Event.ABORT, objs[self.owned(req, objs)].astype(np.intp))  # the NULL object is never owned

def slots_of(pages: NDArray[np.int32], per_page: int, first: int, end: int) -> NDArray[np.int64]:
    """Flat slots `page * per_page + offset` of entries [first, end) of a table of pages (one pass)."""
    if end <= first:
        return np.zeros(0, np.int64)
    p0, p1 = first // per_page, (end - 1) // per_page + 1
    grid = pages[p0:p1, None].astype(np.int64) * per_page + np.arange(per_page, dtype=np.int64)
    found: NDArray[np.int64] = grid.ravel()[first - p0 * per_page:end - p0 * per_page]
    return found
