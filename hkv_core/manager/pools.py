"""Static page pools, one per PoolSpec, with per-page lifecycle state in NumPy arrays.

Every pool is allocated once at construction (static pools: page ids index
preallocated executor pools whose size never changes).  Page 0 of every pool
is the real NULL page: never allocated, never written, the page that skipped
entries point at (not -1).  Page state moves only through the compiled
lifecycle table, in bulk: one table lookup per distinct source state.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.layout import EntryKind, ObjectKind, PoolSpec
from hkv_core.spec.table import Compiled, KindTable

NULL_PAGE = 0
Pages = NDArray[np.int32]
Index = NDArray[np.intp]  # page ids as NumPy indices (fast fancy indexing)


class PoolRole(enum.Enum):
    """How the manager uses a pool; selected by (object kind, entry kind), never by if-chains."""

    PREFIX = "prefix"  # entries for all of [0, P): compressed KV, indexer keys
    WINDOW = "window"  # raw rows of one block: needed for [P - W + 1, P)
    TAIL = "tail"  # one snapshot page per resume point: compressor rows at P


ROLE_OF: dict[tuple[ObjectKind, EntryKind], PoolRole] = {
    (ObjectKind.COMPRESSED_KV, EntryKind.COMPRESSED_ENTRY): PoolRole.PREFIX,
    (ObjectKind.INDEXER_STATE, EntryKind.COMPRESSED_ENTRY): PoolRole.PREFIX,
    (ObjectKind.SWA_WINDOW, EntryKind.WINDOW_ROW): PoolRole.WINDOW,
    (ObjectKind.COMPRESSOR_TAIL, EntryKind.TAIL_ROW): PoolRole.TAIL,
    (ObjectKind.INDEXER_STATE, EntryKind.TAIL_ROW): PoolRole.TAIL,
}


@attrs.frozen(kw_only=True)
class PoolInfo:
    index: int
    spec: PoolSpec
    role: PoolRole
    pages: int  # including the NULL page

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        """The lifecycle kind (state routing: a pool holds pages of exactly one kind)."""
        return self.spec.object_kind.value


class BulkView:
    """GuardView over many pages of one pool: every answer is an array, one element per page."""

    def __init__(self, pool: PagePool, pages: Index, actor: int, full: bool, leased_by_actor: bool) -> None:
        self.pool, self.pages, self.actor = pool, pages, actor
        self.full, self.leased = full, leased_by_actor

    def slot_available(self) -> bool:
        return True  # the pages were taken from the free list before the step

    def is_owner(self) -> NDArray[np.bool_]:
        return np.asarray(self.pool.owner[self.pages] == np.int32(self.actor))

    def rows_full(self) -> bool:
        return self.full

    def leased_by_actor(self) -> bool:
        return self.leased

    def lease_count(self) -> NDArray[np.int32]:
        return self.pool.leases[self.pages]

    def copy_pinned(self) -> NDArray[np.bool_]:
        return self.pool.copies[self.pages] > 0

    def disk_record_durable(self) -> bool:
        return False  # no disk tier on the device manager yet

    def source_set_complete(self) -> bool:
        return False

    def disk_dependents(self) -> int:
        return 0


class PagePool:
    """One static pool: page states, versions, pins, holders, owners and the free stack."""

    def __init__(self, info: PoolInfo, table: KindTable) -> None:
        assert info.pages >= 2, "a pool needs the NULL page and at least one real page"
        self.info, self.table = info, table
        n = info.pages
        self.state = np.full(n, table.initial, np.uint8)
        self.version = np.zeros(n, np.uint32)
        self.leases = np.zeros(n, np.int32)  # lease pins
        self.copies = np.zeros(n, np.int32)  # in-flight copy pins
        self.holders = np.zeros(n, np.int32)  # index references (blocks, resume points)
        self.owner = np.full(n, -1, np.int32)
        self.frozen = np.zeros(n, np.bool_)
        self.free: list[int] = list(range(n - 1, NULL_PAGE, -1))  # a stack; pop() gives low ids first
        self.published = table.state_index["PUBLISHED"]

    def step(self, pages: Pages | Index, event: str, actor: int = -1, *, full: bool = True,
             leased_by_actor: bool = False) -> None:
        """Move every page in `pages` (distinct) by `event`; all-or-nothing (IllegalTransition changes nothing)."""
        if pages.size == 0:
            return
        index = pages.astype(np.intp, copy=False)  # intp indices: gathers and scatters skip a cast
        event_index = self.table.event_index.get(event)
        assert event_index is not None, f"{self.info.kind} has no event {event}"
        states = self.state[index]
        first = int(states[0])
        if index.size == 1 or not np.count_nonzero(states != states[0]):  # one source state: one table lookup
            self._apply(first, index, self.table.step(first, event_index, BulkView(self, index, actor, full,
                                                                                   leased_by_actor)), actor)
            return
        groups = [(s, index[states == s]) for s in np.flatnonzero(np.bincount(states)).tolist()]
        plan = [self.table.step(state, event_index, BulkView(self, group, actor, full, leased_by_actor))
                for state, group in groups]
        for (state, group), edge in zip(groups, plan, strict=True):
            self._apply(state, group, edge, actor)

    def _apply(self, state: int, group: Index, edge: Compiled, actor: int) -> None:
        """Run an edge's effects on pages all in `state` (its guards passed) and move them."""
        # The NULL page never moves, so it stays in the initial state: only that group can hold it.
        assert state != self.table.initial or int(group.min()) > NULL_PAGE, "the NULL page never moves"
        for name in edge.effects:
            EFFECTS[name](self, group, actor)
        if edge.dest != state:
            self.state[group] = edge.dest

    def take(self, count: int, actor: int) -> Pages:
        """Reserve `count` free pages for `actor` (caller checked `len(self.free)`)."""
        assert 0 <= count <= len(self.free), "caller must check free pages first"
        pages = np.fromiter(reversed(self.free[len(self.free) - count:]), np.int32, count)
        del self.free[len(self.free) - count:]
        self.step(pages, "reserve", actor)
        return pages

    def _noop(self, pages: Index, actor: int) -> None:
        return None

    def _free_slot(self, pages: Index, actor: int) -> None:
        self.free.extend(np.sort(pages)[::-1].tolist())  # the stack hands out low page ids first

    def _set_owner(self, pages: Index, actor: int) -> None:
        assert actor >= 0
        self.owner[pages] = actor

    def _clear_owner(self, pages: Index, actor: int) -> None:
        self.owner[pages] = -1

    def _clear_rows(self, pages: Index, actor: int) -> None:
        self.frozen[pages] = False

    def _freeze(self, pages: Index, actor: int) -> None:
        self.frozen[pages] = True

    # A step's pages are distinct, so counters move by plain fancy indexing (not ufunc.at).
    def _add_lease(self, pages: Index, actor: int) -> None:
        self.leases[pages] += 1

    def _drop_lease(self, pages: Index, actor: int) -> None:
        self.leases[pages] -= 1

    def _pin_copy(self, pages: Index, actor: int) -> None:
        self.copies[pages] += 1

    def _unpin_copy(self, pages: Index, actor: int) -> None:
        self.copies[pages] -= 1

    def _bump(self, pages: Index, actor: int) -> None:
        self.version[pages] += np.uint32(1)

    def state_name(self, page: int) -> str:
        return self.table.states[int(self.state[page])]


def add_counts(counts: NDArray[np.int32], pages: Pages | Index, delta: int) -> None:
    """counts[page] += delta for every occurrence of a page in `pages` (repeats add up, like ufunc.at)."""
    if not pages.size:
        return
    low = int(pages.min())
    bins = np.bincount(pages - low)
    counts[low:low + len(bins)] += (delta * bins).astype(counts.dtype)


Effect = Callable[[PagePool, Index, int], None]

EFFECTS: dict[str, Effect] = {
    "take_slot": PagePool._noop, "free_slot": PagePool._free_slot, "set_owner": PagePool._set_owner,
    "clear_owner": PagePool._clear_owner, "append_row": PagePool._noop, "clear_rows": PagePool._clear_rows,
    "freeze_content": PagePool._freeze, "add_lease": PagePool._add_lease, "drop_lease": PagePool._drop_lease,
    "pin_copy": PagePool._pin_copy, "unpin_copy": PagePool._unpin_copy, "bump_version": PagePool._bump,
    "quarantine": PagePool._noop,
}
