"""EntryTable: rows of an index kind (blocks, resume points) with their lifecycle.

An entry has a row of a fixed-size table, a lifecycle state and version
(`specs/lifecycle.toml`, kinds `block` and `resume_point`), and for each page
pool it refers to, a column of object ids (`refs`: width objects per row,
NULL_OBJECT where none).  Rows move only through `step`, which checks the
compiled table's edge and guards (read by the subclass's view) before any
effect runs: `take_row` / `free_row` (the free-row stack), `hold_references`
/ `drop_references` (one `hold` / `unhold` step on the page pools for every
object the chosen columns list, one reference each), `bump_version`.
Objects that lost a reference are collected in `unheld` for the caller to
settle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hkv_core.arrays import all_true, any_true, distinct
from hkv_core.manager.page_pools import NULL_OBJECT, PagePools, PoolSlots
from hkv_core.spec.guards import GuardView
from hkv_core.spec.names import Event
from hkv_core.spec.table import KindTable

Index = NDArray[np.intp]
Ref = tuple[PoolSlots, NDArray[np.int32]]  # (page pool, column of shape (rows, width))
EntryEffect = Callable[["EntryTable", Index, Iterable[int]], Any]
EMPTY = np.zeros(0, np.intp)


class EntryTable:
    """Rows, states, versions and object references of one index kind; subclasses add their columns."""

    FIRES: tuple[Event, ...] = ()  # the events this table fires on its rows (resolved at construction)

    def __init__(self, table: KindTable, capacity: int, objects: PagePools, refs: list[tuple[PoolSlots, int]],
                 sole: frozenset[int] = frozenset(), version: type[np.unsignedinteger[Any]] = np.uint32) -> None:
        """`sole`: columns whose objects no two entries share (a resume point's own tail snapshot).
        `version`: the stamp type (blocks use 16 bits: their identity is their 128-bit key)."""
        assert capacity >= 1
        self.table, self.capacity, self.store = table, capacity, objects
        self.state = np.full(capacity, table.initial, np.uint8)
        self.version = (np.arange(capacity) % (np.iinfo(version).max + 1)).astype(version)
        self.clock = capacity
        self.free_rows = np.arange(capacity - 1, -1, -1, dtype=np.int32)
        self.free_count = capacity
        self.reserved = 0  # rows promised to allocations, taken at commit
        self.refs: list[Ref] = [(pool, np.zeros((capacity, width), np.int32)) for pool, width in refs]
        self.unheld: list[Index] = []
        self.pending: dict[int, tuple[Index, Index | None]] = {}  # column -> (objects, counts) the next hold takes
        self.sole = sole
        self.s_free = table.initial
        self.events = {e: table.event_id(e) for e in self.FIRES}  # SpecError now, not at the first commit

    @property
    def live(self) -> int:
        return self.capacity - self.free_count

    def available(self) -> int:
        """Rows free and not promised to an allocation."""
        return self.free_count - self.reserved

    def view(self, rows: Index) -> GuardView:
        raise NotImplementedError

    def step(self, rows: Index, event: Event, refs: tuple[int, ...] | None = None) -> None:
        """Move `rows` (one source state) by `event`; IllegalTransition changes nothing.

        `refs` limits the reference effects to those columns (an `attach` of some
        page pools' objects holds only them); None: every column.
        """
        if not rows.size:
            return
        states = self.state[rows]
        assert not any_true(states != states[0]), "an index step moves rows of one state"
        edge = self.table.step(int(states[0]), self.events[event], self.view(rows))
        chosen = range(len(self.refs)) if refs is None else refs
        self.store.generation += 1
        for name in edge.effects:
            ENTRY_EFFECTS[name](self, rows, chosen)
        self.state[rows] = edge.dest
        if self.store.seen is not None:
            self.store.seen.add((self.table.kind, event.value))

    def peek_rows(self, count: int) -> Index:
        """The rows `take_row` will hand out next (lowest first)."""
        assert count <= self.free_count, f"{self.table.kind}: {count} rows wanted, {self.free_count} free"
        return self.free_rows[self.free_count - count:self.free_count][::-1].astype(np.intp)

    def _listed(self, rows: Index, refs: Iterable[int], take_pending: bool) -> tuple[Index, Index | None]:
        """Every object the chosen columns list for `rows` (distinct: pools have disjoint ids) and how often
        (None: once each, the usual case)."""
        objs: list[Index] = []
        counts: list[Index | None] = []
        for r in refs:
            n: Index | None
            if take_pending and r in self.pending:
                got, n = self.pending.pop(r)
            else:
                listed = self.refs[r][1][rows].ravel()
                real = listed != NULL_OBJECT
                if not any_true(real):  # nothing listed (a block before its pages)
                    continue
                if r in self.sole:
                    got, n = listed[real].astype(np.intp), None
                else:
                    got, n = _counted(listed)
            objs.append(got)
            counts.append(n)
        if not objs:
            return EMPTY, None
        if len(objs) == 1:
            return objs[0], counts[0]
        if all(n is None for n in counts):
            return np.concatenate(objs), None
        return np.concatenate(objs), np.concatenate([np.ones(o.size, np.intp) if n is None else n
                                                     for o, n in zip(objs, counts, strict=True)])

    def hold(self, rows: Index, refs: Iterable[int]) -> None:
        """hold_references: one `hold` step over every object the chosen columns list."""
        objs, counts = self._listed(rows, refs, take_pending=True)
        self.store.step(objs, Event.HOLD, counts=counts)

    def release(self, rows: Index, refs: Iterable[int]) -> None:
        """drop_references: one `unhold` step over every listed object; the columns are cleared."""
        chosen = list(refs)
        objs, counts = self._listed(rows, chosen, take_pending=False)
        self.store.step(objs, Event.UNHOLD, counts=counts)
        if objs.size:
            self.unheld.append(objs)
        for r in chosen:
            self.refs[r][1][rows] = NULL_OBJECT

    def take_unheld(self) -> Index:
        """Objects that lost references since the last call (distinct)."""
        out, self.unheld = self.unheld, []
        return distinct(np.concatenate(out)) if len(out) > 1 else (out[0] if out else EMPTY)

    def clone_into(self, twin: EntryTable, objects: PagePools) -> None:
        """Copy every array of this table into `twin` (already `object.__new__`), the page pools swapped."""
        twin.__dict__.update(self.__dict__)
        for name, value in self.__dict__.items():
            if isinstance(value, np.ndarray):
                setattr(twin, name, value.copy())
        twin.store = objects
        twin.refs = [(objects.pools[pool.index], column.copy()) for pool, column in self.refs]
        twin.unheld, twin.pending = [], {}


def _counted(objs: NDArray[np.int32]) -> tuple[Index, Index | None]:
    """Distinct non-NULL objects of `objs` and how often each occurs (a sort, no np.unique wrapper)."""
    every = objs.ravel()
    flat: Index = np.sort(every[every != NULL_OBJECT]).astype(np.intp)
    step = flat[1:] != flat[:-1]
    if all_true(step):  # all distinct (the usual case)
        return flat, None
    starts = np.flatnonzero(np.concatenate(([True], step)))
    return flat[starts], np.diff(np.append(starts, flat.size))


def _take_row(table: EntryTable, rows: Index, refs: Iterable[int]) -> None:
    assert rows[0] == table.free_rows[table.free_count - 1], "rows are taken in stack order"
    table.free_count -= rows.size


def _free_row(table: EntryTable, rows: Index, refs: Iterable[int]) -> None:
    top = table.free_count
    table.free_rows[top:top + rows.size] = np.sort(rows)[::-1]
    table.free_count = top + rows.size


def _bump(table: EntryTable, rows: Index, refs: Iterable[int]) -> None:
    wrap = np.iinfo(table.version.dtype).max + 1
    table.version[rows] = (np.arange(table.clock, table.clock + rows.size) % wrap).astype(table.version.dtype)
    table.clock += rows.size


def _not_for_entries(name: str) -> EntryEffect:
    def refuse(table: EntryTable, rows: Index, refs: Iterable[int]) -> None:
        raise AssertionError(f"effect {name} belongs to device objects, not to {table.table.kind} entries")
    return refuse


ENTRY_EFFECTS: Mapping[str, EntryEffect] = MappingProxyType({
    "take_row": _take_row,
    "free_row": _free_row,
    "hold_references": EntryTable.hold,
    "drop_references": EntryTable.release,
    "bump_version": _bump,
    **{name: _not_for_entries(name) for name in (
        "take_slot", "free_slot", "set_owner", "clear_owner", "append_row", "clear_rows", "seal_rows",
        "freeze_content", "add_lease", "drop_lease", "pin_copy", "unpin_copy", "add_holder",
        "drop_holder", "mark_ahead")},
})
