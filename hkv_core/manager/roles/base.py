"""Role: what one kind of page pool is to a resume point, and everything the verbs ask of it.

There are three roles (prefix, window, tail); each owns its page pools and
answers, for them only: what a resume point at P needs (match's conditions),
which objects a hit there reads, where a request's new pages go and what they
cost, what completes at commit, what a request gives back at release, and
what eviction drops.  The verbs call every role in turn and never ask which
role they hold: there is no `if role is ...` outside the role classes.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.layout import Layout
from hkv_core.manager.config import ManagerConfig
from hkv_core.manager.index import PrefixIndex
from hkv_core.manager.page_pool import NULL_OBJECT, PagePool
from hkv_core.manager.requests import RequestState, RequestTable
from hkv_core.plan import CopyPages
from hkv_core.spec.names import Event

Index = NDArray[np.intp]
Bools = NDArray[np.bool_]
Condition = tuple[str, str, str, Bools]  # (layer, reason code, where, usable at b = lo..n)
MISSING_CODE = {"compressed_kv": "COMPRESSED_MISSING", "indexer_state": "INDEXER_MISSING",
                "compressor_tail": "TAIL_MISSING", "swa_window": "WINDOW_MISSING"}
NEVER_FULL = np.iinfo(np.int64).max  # full_token of a page no commit completes (a working tail)


@attrs.frozen(kw_only=True)
class Shared:
    """What every role reads besides its own pools."""

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
    copies: list[CopyPages] = attrs.field(factory=list)
    fills: list[tuple[PagePool, Index]] = attrs.field(factory=list)

    def copy(self, pool: PagePool, src: int, dst: int, entries: Sequence[int]) -> None:
        """Copy the first entries[m] entries of object `src` into object `dst`, in each member pool m."""
        src_page, dst_page, version = int(pool.slot[src]), int(pool.slot[dst]), int(pool.version[src])
        ops = [CopyPages(pool=m.name, src=src_page, dst=dst_page, entries=e, src_version=version)
               for m, e in zip(pool.spec.members, entries, strict=True) if e]
        if ops:
            self.copies += ops
            self.fills.append((pool, np.array([dst], np.intp)))

    def share(self, pool: PagePool, into: dict[str, NDArray[np.int64]] | dict[str, NDArray[np.int32]],
              value: NDArray[np.int64] | NDArray[np.int32]) -> None:
        """The same array for every member pool (they share page ids)."""
        for member in pool.spec.members:
            into[member.name] = value  # type: ignore[assignment]


class Role:
    """Base of the three roles: defaults for roles with nothing to say at some step."""

    def __init__(self, shared: Shared, pools: tuple[PagePool, ...], first_column: int) -> None:
        self.shared, self.pools = shared, pools
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

    def needs(self, req: RequestState, start: int, end: int, boundaries: list[int]) -> list[int]:
        """Per pool: pages tokens [start, end) need (with `boundaries` the points they will keep)."""
        return [0 for _ in self.pools]

    def place(self, req: RequestState, start: int, end: int, boundaries: list[int], out: Builder) -> None:
        """Reserve the pages `needs` counted and say where tokens [start, end) go."""

    # ---------------------------------------------------------- commit / release

    def commit(self, req: RequestState, before: int) -> None:
        """Tokens [before, computed) were written: publish and index what they completed."""

    def points_ready(self, req: RequestState, due: NDArray[np.int64]) -> Bools:
        """Per due boundary: can a point be kept there with this role's objects?"""
        return np.ones(len(due), np.bool_)

    def take_points(self, req: RequestState, due: NDArray[np.int64], keep: Bools) -> list[NDArray[np.int32]]:
        """Publish this role's objects of the points to keep (one matrix per pool) and drop the rest."""
        return []

    def after_commit(self, req: RequestState, pending: list[int]) -> None:
        """Give back what neither the request's position nor a pending point still needs."""

    def release(self, req: RequestState) -> None:
        """The request ends: keep what it completed that the index can use, give back the rest."""

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
             block_pos: Index) -> list[tuple[PagePool, NDArray[np.int32], Index]]:
        """Per pool: (pool, objects, position of the unit dropping each reference) for the units given."""
        return []

    # ---------------------------------------------------------- helpers shared by the roles

    def owned(self, pool: PagePool, req: RequestState, objs: NDArray[np.integer]) -> Bools:
        """Which of `objs` the request owns (RESERVED or READY, not yet published)."""
        return np.asarray(pool.owner[objs] == np.int32(req.slot))

    def pin(self, pool: PagePool, req: RequestState, objs: Index) -> None:
        """The request's lease now lists `objs` (distinct, PUBLISHED, not yet listed)."""
        pool.step(objs, pool.ev[Event.PIN], req.slot)
        req.pins[pool.spec.index].add(objs, pool.version[objs])

    def publish_pinned(self, pool: PagePool, req: RequestState, objs: Index) -> None:
        """Publish owned `objs` and keep them in the request's lease (it still reads them)."""
        pool.step(objs, pool.ev[Event.PUBLISH_PINNED], req.slot)
        req.pins[pool.spec.index].add(objs, pool.version[objs])

    def unpin_all(self, pool: PagePool, req: RequestState) -> None:
        """Drop every pin of the request in `pool`; free what nobody holds any more."""
        pins = req.pins[pool.spec.index]
        objs = pins.objs.view().astype(np.intp)
        pool.step(objs, pool.ev[Event.UNPIN], req.slot)
        pins.clear()
        pool.settle(objs)

    def abort_owned(self, pool: PagePool, req: RequestState, objs: NDArray[np.integer]) -> None:
        """Give back the objects of `objs` (distinct apart from NULL entries) the request still owns."""
        mine = objs[pool.owner[objs] == np.int32(req.slot)]  # the NULL object is never owned
        pool.step(mine.astype(np.intp), pool.ev[Event.ABORT], req.slot)
