"""An open-addressing hash table from 128-bit block keys to block ids, in NumPy.

Lookups are vectorized over a whole prompt's keys (a 65,536-block prompt is
one probe loop over arrays, not a Python loop per block).  Linear probing,
power-of-two capacity, load factor kept at most 1/2, tombstones on removal.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

EMPTY = -1
TOMBSTONE = -2
MIN_CAPACITY = 1024
MAX_LOAD_NUM, MAX_LOAD_DEN = 1, 2


class KeyTable:
    """Maps keys (hi, lo uint64 words) to non-negative int32 ids."""

    def __init__(self, capacity: int = MIN_CAPACITY) -> None:
        assert capacity >= MIN_CAPACITY and capacity & (capacity - 1) == 0, "power-of-two capacity"
        self._alloc(capacity)
        self.count = 0

    def _alloc(self, capacity: int) -> None:
        self.hi = np.zeros(capacity, np.uint64)
        self.lo = np.zeros(capacity, np.uint64)
        self.ids = np.full(capacity, EMPTY, np.int32)
        self.mask = np.uint64(capacity - 1)
        self.used = 0  # live entries + tombstones

    def lookup(self, keys: NDArray[np.uint64]) -> NDArray[np.int32]:
        """Ids of `keys` (shape (n, 2)), EMPTY where absent."""
        assert keys.ndim == 2 and keys.shape[1] == 2
        out = np.full(len(keys), EMPTY, np.int32)
        todo = np.arange(len(keys))
        slot = keys[:, 1] & self.mask
        while todo.size:
            ids = self.ids[slot]
            hit = (ids >= 0) & (self.lo[slot] == keys[todo, 1]) & (self.hi[slot] == keys[todo, 0])
            out[todo[hit]] = ids[hit]
            more = ~hit & (ids != EMPTY)
            todo, slot = todo[more], (slot[more] + np.uint64(1)) & self.mask
        return out

    def insert(self, hi: int, lo: int, block_id: int) -> None:
        """Add one key (absent by contract)."""
        assert block_id >= 0
        if (self.used + 1) * MAX_LOAD_DEN > len(self.ids) * MAX_LOAD_NUM:
            self._rehash(len(self.ids) * (2 if self.count * 4 > len(self.ids) else 1))
        slot = int(lo) & int(self.mask)
        while self.ids[slot] >= 0:
            slot = (slot + 1) & int(self.mask)
        self.used += int(self.ids[slot] == EMPTY)
        self.hi[slot], self.lo[slot], self.ids[slot] = hi, lo, block_id
        self.count += 1

    def insert_many(self, keys: NDArray[np.uint64], ids: NDArray[np.int32]) -> None:
        """Add distinct, absent keys (shape (n, 2)) in one vectorized probe loop."""
        assert len(keys) == len(ids) and np.all(ids >= 0)
        while (self.used + len(keys)) * MAX_LOAD_DEN > len(self.ids) * MAX_LOAD_NUM:
            self._rehash(len(self.ids) * 2)
        todo = np.arange(len(keys))
        slot = keys[:, 1] & self.mask
        while todo.size:
            open_ = self.ids[slot] < 0
            _, first = np.unique(slot, return_index=True)  # one key per slot per round
            take = np.zeros(todo.size, np.bool_)
            take[first] = True
            take &= open_
            chosen, where = todo[take], slot[take]
            self.used += int(np.count_nonzero(self.ids[where] == EMPTY))
            self.hi[where], self.lo[where], self.ids[where] = keys[chosen, 0], keys[chosen, 1], ids[chosen]
            todo, slot = todo[~take], (slot[~take] + np.uint64(1)) & self.mask
        self.count += len(keys)

    def remove(self, hi: int, lo: int) -> int:
        """Remove a key; returns its id (EMPTY when absent)."""
        slot = int(lo) & int(self.mask)
        while self.ids[slot] != EMPTY:
            if self.ids[slot] >= 0 and self.lo[slot] == lo and self.hi[slot] == hi:
                found = int(self.ids[slot])
                self.ids[slot] = TOMBSTONE
                self.count -= 1
                return found
            slot = (slot + 1) & int(self.mask)
        return EMPTY

    def _rehash(self, capacity: int) -> None:
        live = self.ids >= 0
        keys = np.stack([self.hi[live], self.lo[live]], axis=1)
        ids = self.ids[live]
        self._alloc(max(capacity, MIN_CAPACITY))
        self.count = 0
        if len(ids):
            self.insert_many(keys, ids)

    def nbytes(self) -> int:
        return int(self.hi.nbytes + self.lo.nbytes + self.ids.nbytes)
