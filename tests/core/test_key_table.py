"""KeyTable against a Python dict: random insert/remove/remove_ids/lookup sequences, forced collisions.

Keys come mostly from a small universe built to collide: many share a home
slot at the smallest capacity (lo = base + 1024 * j, bases at both ends of the
table so chains wrap), and each lo comes with several his (same 64-bit lo,
different keys).  The block ids live in a stub arena that reallocates its key
column as it grows and scribbles over a row when its id is freed, as the real
arena may.  The table's probing constants are varied so the bulk, window and
scalar paths all run on small tables.  Two broken variants (a lookup that
ignores `hi`; removal that leaves a hole instead of shifting the chain back)
must be caught by the same property.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

import hkv_core.manager.key_table as kt
from hkv_core.manager.key_table import EMPTY, MIN_CAPACITY, KeyTable

Key = tuple[int, int]
HIS = (0, 1, 2**63, 2**64 - 1)
BASES = (0, 1, 5, MIN_CAPACITY - 2, MIN_CAPACITY - 1)
UNIVERSE: list[Key] = [(hi, base + MIN_CAPACITY * j) for base in BASES for j in range(12) for hi in HIS]
TUNINGS = ((2048, 8, 8), (4, 0, 8), (16, 2, 2), (0, 3, 4))  # (BULK_KEYS, SCALAR_KEYS, WINDOW_SLOTS)


class StubArena:
    """Block keys by id, in a column reallocated on growth (the table must read it afresh)."""

    def __init__(self) -> None:
        self.key = np.zeros((4, 2), np.uint64)
        self.free: list[int] = []
        self.next_id = 0

    def add(self, key: Key) -> int:
        block = self.free.pop() if self.free else self._new_id()
        self.key[block] = key
        return block

    def _new_id(self) -> int:
        if self.next_id == len(self.key):
            self.key = np.concatenate([self.key, np.zeros_like(self.key)])
        self.next_id += 1
        return self.next_id - 1

    def drop(self, block: int) -> None:
        self.key[block] = (7, 7)  # a recycled row holds garbage until reused
        self.free.append(block)


@contextmanager
def tuned(bulk: int, scalar: int, window: int) -> Iterator[None]:
    saved = kt.BULK_KEYS, kt.SCALAR_KEYS, kt.WINDOW_SLOTS
    kt.BULK_KEYS, kt.SCALAR_KEYS, kt.WINDOW_SLOTS = bulk, scalar, window
    try:
        yield
    finally:
        kt.BULK_KEYS, kt.SCALAR_KEYS, kt.WINDOW_SLOTS = saved


def as_array(keys: list[Key]) -> NDArray[np.uint64]:
    return np.array(keys, np.uint64).reshape(-1, 2)


def check_chains(table: KeyTable, arena: StubArena) -> None:
    """No empty slot between any entry and its home slot, and load at most 1/2."""
    ids = table.ids
    capacity = len(ids)
    assert capacity & (capacity - 1) == 0 and table.count * 2 <= capacity
    doubled = np.concatenate([ids, ids])
    last_empty = np.maximum.accumulate(np.where(doubled == EMPTY, np.arange(2 * capacity), -1))[capacity:]
    where = np.flatnonzero(ids != EMPTY)
    home = arena.key[ids[where], 1] & np.uint64(capacity - 1)
    distance = (where - home.astype(np.int64)) % capacity
    assert np.all(distance < where + capacity - last_empty[where]), "an entry sits past an empty slot"
    assert int(np.count_nonzero(ids != EMPTY)) == table.count


def run_ops(table_class: type[KeyTable], ops: list[tuple[str, Any]], tuning: tuple[int, int, int]) -> None:
    arena, model = StubArena(), dict[Key, int]()
    table = table_class(arena)
    rng = np.random.default_rng(len(ops))
    with tuned(*tuning):
        for op, arg in ops:
            if op == "insert":
                fresh = list(dict.fromkeys(UNIVERSE[i] for i in arg if UNIVERSE[i] not in model))
                _insert(table, arena, model, fresh)
            elif op == "bulk":
                fresh = [(int(h), int(lo)) for h, lo in rng.integers(0, 2**63, (arg, 2), dtype=np.uint64)]
                _insert(table, arena, model, [k for k in dict.fromkeys(fresh) if k not in model])
            elif op == "drop":
                gone = list(dict.fromkeys(UNIVERSE[i] for i in arg if UNIVERSE[i] in model))
                table.remove_ids(np.array([model[k] for k in gone], np.int32))
                for key in gone:
                    arena.drop(model.pop(key))
            elif op == "remove":
                key = UNIVERSE[arg]
                expected = model.pop(key, EMPTY)
                assert table.remove(*key) == expected
                if expected != EMPTY:
                    arena.drop(expected)
            else:
                probe = [UNIVERSE[i] for i in arg]
                assert table.lookup(as_array(probe)).tolist() == [model.get(k, EMPTY) for k in probe]
            _check_all(table, arena, model)


def _insert(table: KeyTable, arena: StubArena, model: dict[Key, int], fresh: list[Key]) -> None:
    ids = [arena.add(key) for key in fresh]  # the arena row holds the key before the insert
    table.insert_many(as_array(fresh), np.array(ids, np.int32))
    model.update(zip(fresh, ids, strict=True))


def _check_all(table: KeyTable, arena: StubArena, model: dict[Key, int]) -> None:
    assert table.count == len(model)
    probe = UNIVERSE + list(model)
    assert table.lookup(as_array(probe)).tolist() == [model.get(k, EMPTY) for k in probe]
    check_chains(table, arena)


universe_index = st.integers(0, len(UNIVERSE) - 1)
operations = st.lists(st.one_of(
    st.tuples(st.just("insert"), st.lists(universe_index, max_size=60)),
    st.tuples(st.just("bulk"), st.integers(1, 700)),
    st.tuples(st.just("remove"), universe_index),
    st.tuples(st.just("drop"), st.lists(universe_index, max_size=30)),
    st.tuples(st.just("lookup"), st.lists(universe_index, max_size=40)),
), max_size=12)


@given(ops=operations, tuning=st.sampled_from(TUNINGS))
def test_key_table_matches_a_dict(ops: list[tuple[str, Any]], tuning: tuple[int, int, int]) -> None:
    run_ops(KeyTable, ops, tuning)


class IgnoresHi(KeyTable):
    """Broken: lookup compares the lo words only."""

    def lookup(self, keys: NDArray[np.uint64]) -> NDArray[np.int32]:
        source, self.source = self.source, StubArena()
        self.source.key = source.key.copy()
        self.source.key[:, 0] = 0
        try:
            return super().lookup(np.stack([np.zeros_like(keys[:, 1]), keys[:, 1]], axis=1))
        finally:
            self.source = source


class LeavesHoles(KeyTable):
    """Broken: removal empties the slot without shifting the rest of the chain back."""

    def _close_gap(self, hole: int) -> None:
        self.ids[hole] = EMPTY


@pytest.mark.parametrize("broken", [IgnoresHi, LeavesHoles])
def test_the_property_catches_a_broken_table(broken: type[KeyTable]) -> None:
    @settings(max_examples=300, database=None, phases=[Phase.generate])
    @given(ops=operations, tuning=st.sampled_from(TUNINGS))
    def prop(ops: list[tuple[str, Any]], tuning: tuple[int, int, int]) -> None:
        run_ops(broken, ops, tuning)

    with pytest.raises(AssertionError):
        prop()


def test_growth_rehash_and_absent_removal() -> None:
    arena, model = StubArena(), dict[Key, int]()
    table = KeyTable(arena)
    keys = [(hi, lo) for hi in HIS for lo in range(0, 200 * MIN_CAPACITY, MIN_CAPACITY)]  # 800 keys, 1 home
    _insert(table, arena, model, keys)
    assert len(table.ids) == 2 * MIN_CAPACITY and table.nbytes() == 4 * len(table.ids)
    _check_all(table, arena, model)
    assert table.remove(3, 0) == EMPTY and table.remove(0, 1) == EMPTY and table.count == len(model)
    for key in keys[::3]:
        assert table.remove(*key) == model.pop(key)
    _check_all(table, arena, model)


def test_clone_is_independent() -> None:
    arena, model = StubArena(), dict[Key, int]()
    table = KeyTable(arena)
    _insert(table, arena, model, UNIVERSE[:50])
    twin_arena = StubArena()
    twin_arena.key = arena.key.copy()
    twin = table.clone(twin_arena)
    assert table.remove(*UNIVERSE[0]) == model[UNIVERSE[0]]
    assert twin.lookup(as_array(UNIVERSE[:1])).tolist() == [model[UNIVERSE[0]]] and twin.count == 50
    assert twin.source is twin_arena and table.lookup(as_array(UNIVERSE[:1])).tolist() == [EMPTY]
