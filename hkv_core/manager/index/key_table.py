"""An open-addressing hash table from 128-bit block keys to block ids, in NumPy.

The table stores only block ids (int32: 4 bytes a slot, about 6 bytes a block
at the maximum load of 2/3).  The keys live in the block table's `key` column
(index/blocks.py), and a probe compares a slot by gathering `source.key[id]`.
So a block's key must be in its row before the block is inserted, and the
block must be removed before its row is recycled.

Linear probing from the home slot `lo mod capacity`, the capacity fixed at
construction (hkv_core/manager/limits.py sizes it to the fewest slots that
keep the block table's rows at most 2/3 of it: no rounding up to a power of
two, which would cost up to a third more bytes per block).  Removal is
backward-shift deletion rather than tombstones: the entries after the hole
move back while each stays at or after its home slot, so probe
chains stay as short as a fresh table's under any insert/evict churn, a lookup
always stops at the first empty slot, and no same-capacity rehash is needed.
`remove_ids` finds each block by its id along its key's chain (no key
comparisons); many removals at once run as one bulk pass (`_remove_bulk`).

Lookups and inserts are vectorized over a whole prompt's keys: a round probes
a window of slots per pending key with a few array operations laid out
(window slots, keys), so each operation runs along the keys.  Large batches
probe one slot a round (the window would multiply the gathered bytes); once
at most `BULK_KEYS` keys are left a round reads `WINDOW_SLOTS` slots (an
insert round of at most `INSERT_WINDOW_KEYS` keys `INSERT_WINDOW_SLOTS`: it
looks for an empty slot, which at load 2/3 lies further on), which settles
nearly every key.  In an insert round the keys that reach
the same empty slot are told apart by a scatter into a scratch array (each
writes its index at its slot; the one that reads its own index back wins).
The last `SCALAR_KEYS` keys of a long chain finish in a plain Python loop, so
the tail of the chain-length distribution costs a few scalar probes rather
than an array round each.
"""

from __future__ import annotations

import copy
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

EMPTY = -1
PENDING = -2  # a probe round's verdict for a key whose window holds neither it nor an empty slot
MIN_CAPACITY = 1024
MAX_LOAD_NUM, MAX_LOAD_DEN = 2, 3
WINDOW_SLOTS = 8  # slots a lookup round reads per key once at most BULK_KEYS keys are pending
INSERT_WINDOW_SLOTS = 32  # slots an insert round reads per key: at load 2/3 a window of 8 leaves ~1 key in 6
# without an empty slot (another round, or a scalar scan along a long run); one of 32 settles nearly all
INSERT_WINDOW_KEYS = 256  # ... for batches up to this many keys (larger ones: the wide window gathers too much)
BULK_KEYS = 2048
SCALAR_KEYS = 8  # pending keys at or below this count finish in a Python loop
BULK_REMOVE_KEYS = 32  # removals above this count run in array rounds
V16 = np.dtype("V16")
OFFSETS = np.arange(max(WINDOW_SLOTS, INSERT_WINDOW_SLOTS), dtype=np.intp)[:, None]


class KeySource(Protocol):
    """Whatever holds each block's key: row `id` of `key`, shape (blocks, 2) uint64 [hi, lo]."""

    @property
    def key(self) -> NDArray[np.uint64]: ...


class KeyTable:
    """Maps keys (hi, lo uint64 words) to non-negative int32 ids whose keys `source` holds."""

    def __init__(self, source: KeySource, capacity: int = MIN_CAPACITY) -> None:
        assert capacity >= MIN_CAPACITY, "capacity below the minimum"
        self.source = source
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        self.scratch: NDArray[np.int32] | None = None  # claims of an insert round (allocated at first use)
        self.ids = np.full(capacity, EMPTY, np.int32)
        self.size = capacity
        self.count = 0

    def clone(self, source: KeySource) -> KeyTable:
        """An independent copy reading keys from `source` (a copy of this table's source)."""
        twin = copy.copy(self)
        twin.source, twin.ids, twin.scratch = source, self.ids.copy(), None
        return twin

    def _home(self, lo: NDArray[np.uint64]) -> NDArray[np.intp]:
        home: NDArray[np.intp] = (lo % np.uint64(self.size)).astype(np.intp)
        return home

    def lookup(self, keys: NDArray[np.uint64]) -> NDArray[np.int32]:
        """Ids of `keys` (shape (n, 2)), EMPTY where absent."""
        assert keys.ndim == 2 and keys.shape[1] == 2 and keys.dtype == np.uint64
        if len(keys) == 1:
            lo = int(keys[0, 1])
            return np.array([self._find(int(keys[0, 0]), lo, lo % self.size)[1]], np.int32)
        slot = self._home(keys[:, 1])
        if len(keys) <= SCALAR_KEYS:
            return self._finish(keys, np.full(len(keys), EMPTY, np.int32), np.arange(len(keys)), slot)
        wanted, rows = _as_rows(keys), _as_rows(self.source.key)
        width = _width(len(keys))
        out = self._probe(rows, wanted, slot, width)
        todo = np.flatnonzero(out == PENDING)
        slot = slot.take(todo) + width
        while todo.size > SCALAR_KEYS:
            width = _width(todo.size)
            out[todo] = found = self._probe(rows, wanted.take(todo), slot, width)
            keep = np.flatnonzero(found == PENDING)
            todo, slot = todo.take(keep), slot.take(keep) + width
        return self._finish(keys, out, todo, slot)

    def find(self, key: NDArray[np.uint64]) -> int:
        """The id of one key (shape (2,)), EMPTY when absent."""
        lo = int(key[1])
        return self._find(int(key[0]), lo, lo % self.size)[1]

    def find_row(self, keys: NDArray[np.uint64], row: int) -> int:
        """The id of key `keys[row]` (keys of shape (n, 2)), EMPTY when absent."""
        lo = keys.item(row, 1)
        return self._find(keys.item(row, 0), lo, lo % self.size)[1]

    def _probe(self, rows: NDArray[np.void], keys: NDArray[np.void], slot: NDArray[np.intp],
               width: int) -> NDArray[np.int32]:
        """One round over `width` slots from `slot` per key: its id, EMPTY when absent (an empty
        slot ends its chain first), PENDING when the window holds neither."""
        window = self._window(slot, width)
        same = rows.take(window, mode="wrap").view(np.uint64) == keys.view(np.uint64)
        hit = same.view(np.uint16) == 0x0101  # both words equal (a hit at an EMPTY slot is moot)
        code = np.where(hit, window, PENDING - (window >> 31))  # not hit: EMPTY if empty, else PENDING
        found: NDArray[np.int32] = code.max(axis=0) if width > 1 else code[0]
        return found  # max: an id > EMPTY (the window's empty slots) > PENDING (its other slots)

    def _window(self, slot: NDArray[np.intp], width: int) -> NDArray[np.int32]:
        """Ids in slots slot, slot + 1, ... (width, keys); wraps around the end."""
        window: NDArray[np.int32] = self.ids.take(slot + OFFSETS[:width], mode="wrap")
        return window

    def _finish(self, keys: NDArray[np.uint64], out: NDArray[np.int32], todo: NDArray[np.intp],
                slot: NDArray[np.intp]) -> NDArray[np.int32]:
        """Probe the keys `todo` left from `slot` one by one, in Python."""
        for i, start in zip(todo.tolist(), slot.tolist(), strict=True):
            out[i] = self._find(int(keys[i, 0]), int(keys[i, 1]), start % self.size)[1]
        return out

    def _find(self, hi: int, lo: int, slot: int) -> tuple[int, int]:
        """(slot, id) of the key probing from `slot`; (the empty slot ending the chain, EMPTY) if absent."""
        table, stored, size = self.ids, self.source.key, self.size
        while (found := table.item(slot)) != EMPTY:
            if stored.item(found, 1) == lo and stored.item(found, 0) == hi:
                return slot, found
            slot = (slot + 1) % size
        return slot, EMPTY

    def insert(self, hi: int, lo: int, block_id: int) -> None:
        """Add one key (absent by contract; `source.key[block_id]` holds it)."""
        self.insert_many(np.array([[hi, lo]], np.uint64), np.array([block_id], np.int32))

    def insert_many(self, keys: NDArray[np.uint64], ids: NDArray[np.integer]) -> None:
        """Add distinct, absent keys (shape (n, 2)); `source.key[ids]` already holds them."""
        assert len(keys) == len(ids) and (not len(ids) or int(ids.min()) >= 0)
        assert (self.count + len(keys)) * MAX_LOAD_DEN <= len(self.ids) * MAX_LOAD_NUM, "capacity is fixed"
        self._place(keys[:, 1], ids.astype(np.int32, copy=False))

    def _place(self, lo: NDArray[np.uint64], ids: NDArray[np.int32]) -> None:
        """Write `ids` at the first empty slot of each probe chain (home slot from `lo`)."""
        todo, slot = np.arange(len(ids), dtype=np.int32), self._home(lo)
        if todo.size > SCALAR_KEYS:
            if self.scratch is None:
                self.scratch = np.empty(len(self.ids), np.int32)
            scratch = self.scratch
            while todo.size > SCALAR_KEYS:
                width = _width(todo.size, INSERT_WINDOW_SLOTS if todo.size <= INSERT_WINDOW_KEYS else WINDOW_SLOTS)
                todo, slot = self._claim(scratch, ids, todo, slot, width)
        for i, start in zip(todo.tolist(), slot.tolist(), strict=True):
            self.ids[self._empty_slot(start % self.size)] = ids[i]
        self.count += len(ids)

    def _claim(self, scratch: NDArray[np.int32], ids: NDArray[np.int32], todo: NDArray[np.int32],
               slot: NDArray[np.intp], width: int) -> tuple[NDArray[np.int32], NDArray[np.intp]]:
        """One insert round: each key takes the first empty slot in its window unless another key
        takes it (scatter `todo` into `scratch` there; who reads its own index back wins).
        Returns the keys left and the slot each resumes from."""
        offset = np.where(self._window(slot, width) == EMPTY, OFFSETS[:width], width).min(axis=0)
        has = offset < width  # else offset is width: no empty slot in the window
        target = (slot + offset) % self.size
        scratch[target] = todo  # a key without an empty slot writes at an occupied one: nobody wins there
        won = has & (scratch[target] == todo)
        self.ids[target[won]] = ids[todo[won]]
        lost = ~won
        resume = np.where(has, target + 1, slot + width)[lost]  # the slots before are taken now
        return todo[lost], resume

    def _empty_slot(self, slot: int) -> int:
        table, size = self.ids, self.size
        while table.item(slot) != EMPTY:
            slot = (slot + 1) % size
        return slot

    def remove(self, hi: int, lo: int) -> int:
        """Remove a key; returns its id (EMPTY when absent)."""
        slot, found = self._find(hi, lo, lo % self.size)
        if found != EMPTY:
            self._close_gap(slot)
            self.count -= 1
        return found

    def remove_ids(self, ids: NDArray[np.integer]) -> None:
        """Remove the blocks `ids`, each present (their rows in `source` still hold their keys).

        A few: backward-shift deletion, one at a time.  Many (an eviction): in
        bulk - empty their slots, lift out every entry of the runs that follow
        the holes (up to the next empty slot: the only entries a hole can cut
        off from their home) and insert those again, all with array rounds.
        """
        if len(ids) > BULK_REMOVE_KEYS:
            self._remove_bulk(ids.astype(np.int32))
            return
        table, stored, size = self.ids, self.source.key, self.size
        for block in ids.tolist():
            slot = stored.item(block, 1) % size
            while (entry := table.item(slot)) != block:
                assert entry != EMPTY, f"block {block} is not in the table"
                slot = (slot + 1) % size
            self._close_gap(slot)
        self.count -= len(ids)

    def _remove_bulk(self, ids: NDArray[np.int32]) -> None:
        holes = self._slots_of(ids)
        self.ids[holes] = EMPTY
        # The run after each hole ends at the first empty slot after it (cyclically): one search over the
        # empty slots finds every end at once.  Runs hold no empty slot, so they are disjoint.
        empties = np.flatnonzero(self.ids == EMPTY)  # the holes among them
        ends = np.append(empties, empties[0] + self.size)[np.searchsorted(empties, holes, side="right")]
        lengths = ends - holes - 1
        total = int(lengths.sum())
        starts = np.repeat(holes + 1 - (np.cumsum(lengths) - lengths), lengths)
        moved = np.sort((starts + np.arange(total)) % self.size)
        entries = self.ids[moved]
        self.ids[moved] = EMPTY
        self.count -= len(ids) + len(entries)
        self._place(self.source.key[entries, 1], entries)

    def _slots_of(self, ids: NDArray[np.int32]) -> NDArray[np.intp]:
        """The slot of each present block id, found along its key's probe chain (ids compared, not keys)."""
        slot = self._home(self.source.key[ids, 1])
        out = np.empty(len(ids), np.intp)
        todo = np.arange(len(ids))
        while todo.size:
            found = self.ids[slot] == ids[todo]
            out[todo[found]] = slot[found]
            todo, slot = todo[~found], (slot[~found] + 1) % self.size
        return out

    def _close_gap(self, hole: int) -> None:
        """Backward-shift deletion: move later entries of the chain into the hole while each stays
        at or after its home slot; the last hole becomes EMPTY."""
        table, stored, size = self.ids, self.source.key, self.size
        slot = (hole + 1) % size
        while (entry := table.item(slot)) != EMPTY:
            home = stored.item(entry, 1) % size
            if (slot - home) % size >= (slot - hole) % size:  # cyclic distances (Python's % is never negative)
                table[hole], hole = entry, slot
            slot = (slot + 1) % size
        table[hole] = EMPTY

    def nbytes(self) -> int:
        return int(self.ids.nbytes)


def _as_rows(keys: NDArray[np.uint64]) -> NDArray[np.void]:
    """(n, 2) uint64 keys as n 16-byte items: one gather moves a whole key."""
    rows: NDArray[np.void] = np.ascontiguousarray(keys).view(V16).reshape(len(keys))
    return rows


def _width(pending_keys: int, window: int = WINDOW_SLOTS) -> int:
    """Slots a round reads per key: one for a bulk batch, else a window."""
    return 1 if pending_keys > BULK_KEYS else window
