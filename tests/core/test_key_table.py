"""KeyTable against a Python dict: random insert/remove/remove_ids/lookup sequences, forced collisions.

Keys come mostly from a small universe built to collide: many share a home
slot at the smallest capacity (lo = base + 1024 * j, bases at both ends of the
table so chains wrap), and each lo comes with several his (same 64-bit lo,
different keys).  The block ids live in a stub block table with a fixed key
column (the table's capacity is fixed too: no rehash, load at most 2/3) that
scribbles over a row when its id is freed, as the real block table may once
the row is reused.  The table's probing constants are varied so the bulk,
window and scalar paths of lookup, insert and removal all run on small
tables.  Three broken variants (a lookup that ignores `hi`; a removal that
leaves a hole instead of shifting the chain back; a bulk removal that does
not place the cut-off runs again) must be caught by the same property.
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

import hkv_core.manager.index.key_table as kt
from hkv_core.manager.index.key_table import EMPTY, MAX_LOAD_DEN, MAX_LOAD_NUM, MIN_CAPACITY, KeyTable
from hkv_core.manager.limits import key_table_slots

Key = tuple[int, int]
HIS = (0, 1, 2**63, 2**64 - 1)
BASES = (0, 1, 5, MIN_CAPACITY - 2, MIN_CAPACITY - 1)
UNIVERSE: list[Key] = [(hi, base + MIN_CAPACITY * j) for base in BASES for j in range(12) for hi in HIS]
# (BULK_KEYS, SCALAR_KEYS, WINDOW_SLOTS, BULK_REMOVE_KEYS)
TUNINGS = ((2048, 8, 8, 32), (4, 0, 8, 0), (16, 2, 2, 4), (0, 3, 4, 1000))
CAPACITIES = (MIN_CAPACITY, MIN_CAPACITY + 1, 2 * MIN_CAPACITY)  # + 1: homes are `lo mod capacity`, any size
ROWS = 2 * MIN_CAPACITY  # rows of the stub block table (more than any table here may hold)


def room(capacity: int) -> int:
    """Keys a table of `capacity` slots holds at its maximum load (2/3)."""
    return capacity * MAX_LOAD_NUM // MAX_LOAD_DEN


class StubBlocks:
    """Block keys by id, in a fixed key column; a freed row holds garbage until it is reused."""

    def __init__(self) -> None:
        self.key = np.zeros((ROWS, 2), np.uint64)
        self.free: list[int] = []
        self.next_id = 0

    def add(self, key: Key) -> int:
        if self.free:
            block = self.free.pop()
        else:
            assert self.next_id < ROWS
            block, self.next_id = self.next_id, self.next_id + 1
        self.key[block] = key
        return block

    def drop(self, block: int) -> None:
        self.key[block] = (7, 7)  # a recycled row holds garbage until reused
        self.free.append(block)


@contextmanager
def tuned(bulk: int, scalar: int, window: int, bulk_remove: int) -> Iterator[None]:
    saved = kt.BULK_KEYS, kt.SCALAR_KEYS, kt.WINDOW_SLOTS, kt.BULK_REMOVE_KEYS
    kt.BULK_KEYS, kt.SCALAR_KEYS, kt.WINDOW_SLOTS, kt.BULK_REMOVE_KEYS = bulk, scalar, window, bulk_remove
    try:
        yield
    finally:
        kt.BULK_KEYS, kt.SCALAR_KEYS, kt.WINDOW_SLOTS, kt.BULK_REMOVE_KEYS = saved


def as_array(keys: list[Key]) -> NDArray[np.uint64]:
    return np.array(keys, np.uint64).reshape(-1, 2)


def check_chains(table: KeyTable, blocks: StubBlocks, capacity: int) -> None:
    """No empty slot between any entry and its home slot; the capacity never changes; load at most 2/3."""
    ids = table.ids
    assert len(ids) == capacity and table.size == capacity
    assert table.count * MAX_LOAD_DEN <= capacity * MAX_LOAD_NUM
    doubled = np.concatenate([ids, ids])
    last_empty = np.maximum.accumulate(np.where(doubled == EMPTY, np.arange(2 * capacity), -1))[capacity:]
    where = np.flatnonzero(ids != EMPTY)
    home = blocks.key[ids[where], 1] % np.uint64(capacity)
    distance = (where - home.astype(np.int64)) % capacity
    assert np.all(distance < where + capacity - last_empty[where]), "an entry sits past an empty slot"
    assert int(np.count_nonzero(ids != EMPTY)) == table.count


def run_ops(table_class: type[KeyTable], ops: list[tuple[str, Any]], tuning: tuple[int, int, int, int],
            capacity: int) -> None:
    blocks, model = StubBlocks(), dict[Key, int]()
    table = table_class(blocks, capacity)
    rng = np.random.default_rng(len(ops))
    with tuned(*tuning):
        for op, arg in ops:
            if op == "insert":
                fresh = list(dict.fromkeys(UNIVERSE[i] for i in arg if UNIVERSE[i] not in model))
                _insert(table, blocks, model, fresh[:room(capacity) - len(model)])
            elif op == "bulk":
                fresh = [(int(h), int(lo)) for h, lo in rng.integers(0, 2**63, (arg, 2), dtype=np.uint64)]
                fresh = [k for k in dict.fromkeys(fresh) if k not in model]
                _insert(table, blocks, model, fresh[:room(capacity) - len(model)])
            elif op == "drop":
                gone = list(dict.fromkeys(UNIVERSE[i] for i in arg if UNIVERSE[i] in model))
                _remove_ids(table, blocks, model, gone)
            elif op == "drop_many":  # an eviction: any keys held, in one call
                held = list(model)
                picked = rng.permutation(len(held))[:arg].tolist()
                _remove_ids(table, blocks, model, [held[i] for i in picked])
            elif op == "remove":
                key = UNIVERSE[arg]
                expected = model.pop(key, EMPTY)
                assert table.remove(*key) == expected
                if expected != EMPTY:
                    blocks.drop(expected)
            else:
                probe = [UNIVERSE[i] for i in arg]
                assert table.lookup(as_array(probe)).tolist() == [model.get(k, EMPTY) for k in probe]
            _check_all(table, blocks, model, capacity)


def _insert(table: KeyTable, blocks: StubBlocks, model: dict[Key, int], fresh: list[Key]) -> None:
    ids = [blocks.add(key) for key in fresh]  # the block row holds the key before the insert
    table.insert_many(as_array(fresh), np.array(ids, np.int32))
    model.update(zip(fresh, ids, strict=True))


def _remove_ids(table: KeyTable, blocks: StubBlocks, model: dict[Key, int], gone: list[Key]) -> None:
    table.remove_ids(np.array([model[k] for k in gone], np.int32))  # rows still hold their keys
    for key in gone:
        blocks.drop(model.pop(key))


def _check_all(table: KeyTable, blocks: StubBlocks, model: dict[Key, int], capacity: int) -> None:
    assert table.count == len(model)
    probe = UNIVERSE + list(model)
    assert table.lookup(as_array(probe)).tolist() == [model.get(k, EMPTY) for k in probe]
    check_chains(table, blocks, capacity)


universe_index = st.integers(0, len(UNIVERSE) - 1)
operations = st.lists(st.one_of(
    st.tuples(st.just("insert"), st.lists(universe_index, max_size=60)),
    st.tuples(st.just("bulk"), st.integers(1, 700)),
    st.tuples(st.just("remove"), universe_index),
    st.tuples(st.just("drop"), st.lists(universe_index, max_size=30)),
    st.tuples(st.just("drop_many"), st.integers(1, 400)),
    st.tuples(st.just("lookup"), st.lists(universe_index, max_size=40)),
), max_size=12)


@given(ops=operations, tuning=st.sampled_from(TUNINGS), capacity=st.sampled_from(CAPACITIES))
def test_key_table_matches_a_dict(ops: list[tuple[str, Any]], tuning: tuple[int, int, int, int],
                                  capacity: int) -> None:
    run_ops(KeyTable, ops, tuning, capacity)


class IgnoresHi(KeyTable):
    """Broken: lookup compares the lo words only."""

    def lookup(self, keys: NDArray[np.uint64]) -> NDArray[np.int32]:
        source, self.source = self.source, StubBlocks()
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


class BulkLeavesHoles(KeyTable):
    """Broken: a bulk removal empties the slots but does not place the runs after the holes again."""

    def _remove_bulk(self, ids: NDArray[np.int32]) -> None:
        self.ids[self._slots_of(ids)] = EMPTY
        self.count -= len(ids)


class WrapBlind(KeyTable):
    """Broken: backward shift compares plain distances, so chains that wrap past the last slot break."""

    def _close_gap(self, hole: int) -> None:
        table, stored, size = self.ids, self.source.key, self.size
        slot = (hole + 1) % size
        while (entry := table.item(slot)) != EMPTY:
            if slot - stored.item(entry, 1) % size >= slot - hole:
                table[hole], hole = entry, slot
            slot = (slot + 1) % size
        table[hole] = EMPTY


@pytest.mark.parametrize("broken", [IgnoresHi, LeavesHoles, BulkLeavesHoles, WrapBlind])
def test_the_property_catches_a_broken_table(broken: type[KeyTable]) -> None:
    @settings(max_examples=300, database=None, phases=[Phase.generate], derandomize=True)
    @given(ops=operations, tuning=st.sampled_from(TUNINGS), capacity=st.sampled_from(CAPACITIES))
    def prop(ops: list[tuple[str, Any]], tuning: tuple[int, int, int, int], capacity: int) -> None:
        run_ops(broken, ops, tuning, capacity)

    with pytest.raises(AssertionError):
        prop()


def test_capacity_is_fixed_a_full_table_refuses_and_absent_removal() -> None:
    blocks, model = StubBlocks(), dict[Key, int]()
    table = KeyTable(blocks)
    assert len(table.ids) == MIN_CAPACITY and table.nbytes() == 4 * MIN_CAPACITY
    full = room(MIN_CAPACITY)
    keys = [(hi, lo) for hi in HIS for lo in range(0, full * MIN_CAPACITY, MIN_CAPACITY)][:full]  # one home
    _insert(table, blocks, model, keys)
    assert len(table.ids) == MIN_CAPACITY and table.count == full, "no rehash: the capacity is fixed"
    _check_all(table, blocks, model, MIN_CAPACITY)
    before = table.ids.copy()
    with pytest.raises(AssertionError, match="capacity is fixed"):
        _insert(table, blocks, dict[Key, int](), [(5, 5)])
    assert np.array_equal(table.ids, before) and table.count == full, "a refused insert changes nothing"
    assert table.remove(3, 0) == EMPTY and table.remove(0, 1) == EMPTY and table.count == len(model)
    for key in keys[::3]:
        assert table.remove(*key) == model.pop(key)
    _check_all(table, blocks, model, MIN_CAPACITY)


def test_capacity_is_at_least_the_minimum_and_sized_to_the_load() -> None:
    for bad in (0, MIN_CAPACITY // 2, MIN_CAPACITY - 1):
        with pytest.raises(AssertionError, match="below the minimum"):
            KeyTable(StubBlocks(), bad)
    for good in (MIN_CAPACITY, MIN_CAPACITY + 1, 3 * MIN_CAPACITY):  # any size: homes are `lo mod capacity`
        assert len(KeyTable(StubBlocks(), good).ids) == good
    for rows in (1, 682, 683, 1365, 1366, 10_000, 66_816):  # the manager sizes its table for its block rows
        slots = key_table_slots(rows)
        assert slots >= MIN_CAPACITY and room(slots) >= rows
        assert slots == MIN_CAPACITY or room(slots - 1) < rows  # the fewest slots that keep the load <= 2/3


def test_the_manager_key_table_matches_its_block_rows() -> None:
    from hkv_core.layout import Layout
    from hkv_core.manager import CacheManager, ManagerConfig

    m = CacheManager(Layout.from_preset("llama_full"),
                     ManagerConfig(default_pool_pages=16, max_blocks=5000, key_seed=0))
    keys = m.core.index.keys
    assert len(keys.ids) == key_table_slots(5000) and room(len(keys.ids)) >= m.core.index.blocks.capacity
    assert keys.source is m.core.index.blocks


def test_clone_is_independent() -> None:
    blocks, model = StubBlocks(), dict[Key, int]()
    table = KeyTable(blocks)
    _insert(table, blocks, model, UNIVERSE[:50])
    twin_blocks = StubBlocks()
    twin_blocks.key = blocks.key.copy()
    twin = table.clone(twin_blocks)
    assert table.remove(*UNIVERSE[0]) == model[UNIVERSE[0]]
    assert twin.lookup(as_array(UNIVERSE[:1])).tolist() == [model[UNIVERSE[0]]] and twin.count == 50
    assert twin.source is twin_blocks and table.lookup(as_array(UNIVERSE[:1])).tolist() == [EMPTY]
