"""Per-block metadata of the prefix index, in growable NumPy columns.

One row per indexed block: its 128-bit key, parent block, position, child
count, last access tick, and per pool the page covering it (prefix pools),
its window page (window pools, NULL unless a retained resume point needs it)
and, when a resume point is retained at the block's end, its tail snapshot
pages.  About 60-90 bytes per block depending on the layout (README).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.pools import NULL_PAGE

NO_BLOCK = -1
MIN_BLOCKS = 256


class BlockArena:
    """Columns indexed by block id; ids are recycled through a free stack."""

    def __init__(self, prefix_pools: int, window_pools: int, tail_pools: int) -> None:
        self.widths = (prefix_pools, window_pools, tail_pools)
        self.capacity = 0
        self.free: list[int] = []
        self.live = 0
        self._grow(MIN_BLOCKS)

    def _grow(self, capacity: int) -> None:
        old = self.capacity
        pw, ww, tw = self.widths

        def grown(array: NDArray[Any] | None, shape: tuple[int, ...], dtype: type, fill: int) -> NDArray[Any]:
            new: NDArray[Any] = np.full(shape, fill, dtype)
            if array is not None:
                new[:old] = array
            return new

        get = self.__dict__.get
        self.key = grown(get("key"), (capacity, 2), np.uint64, 0)
        self.parent = grown(get("parent"), (capacity,), np.int32, NO_BLOCK)
        self.position = grown(get("position"), (capacity,), np.int32, -1)  # block index in its prompt
        self.children = grown(get("children"), (capacity,), np.int32, 0)
        self.last_access = grown(get("last_access"), (capacity,), np.int64, 0)
        self.alive = grown(get("alive"), (capacity,), np.bool_, 0)
        self.point = grown(get("point"), (capacity,), np.bool_, 0)
        self.prefix_pages = grown(get("prefix_pages"), (capacity, pw), np.int32, NULL_PAGE)
        self.window_pages = grown(get("window_pages"), (capacity, ww), np.int32, NULL_PAGE)
        self.tail_pages = grown(get("tail_pages"), (capacity, tw), np.int32, NULL_PAGE)
        self.free.extend(range(capacity - 1, old - 1, -1))
        self.capacity = capacity

    def add(self, key: NDArray[np.uint64], parent: int, position: int, prefix_pages: NDArray[np.int32],
            tick: int) -> int:
        """A new live block; returns its id."""
        if not self.free:
            self._grow(self.capacity * 2)
        block = self.free.pop()
        assert not self.alive[block]
        self.key[block] = key
        self.parent[block], self.position[block], self.children[block] = parent, position, 0
        self.last_access[block], self.alive[block], self.point[block] = tick, True, False
        self.prefix_pages[block] = prefix_pages
        self.window_pages[block] = NULL_PAGE
        self.tail_pages[block] = NULL_PAGE
        if parent != NO_BLOCK:
            self.children[parent] += 1
        self.live += 1
        return block

    def add_chain(self, keys: NDArray[np.uint64], parent: int, position: int, tick: int) -> NDArray[np.int32]:
        """New live blocks for consecutive keys, each the parent of the next; returns their ids."""
        count = len(keys)
        while len(self.free) < count:
            self._grow(self.capacity * 2)
        ids = np.array(self.free[len(self.free) - count:][::-1], np.int32)
        del self.free[len(self.free) - count:]
        assert not np.any(self.alive[ids])
        self.key[ids] = keys
        self.parent[ids[0]] = parent
        self.parent[ids[1:]] = ids[:-1]
        self.position[ids] = np.arange(position, position + count, dtype=np.int32)
        self.children[ids] = 1
        self.children[ids[-1]] = 0
        self.last_access[ids], self.alive[ids], self.point[ids] = tick, True, False
        self.prefix_pages[ids] = NULL_PAGE
        self.window_pages[ids] = NULL_PAGE
        self.tail_pages[ids] = NULL_PAGE
        if parent != NO_BLOCK:
            self.children[parent] += 1
        self.live += count
        return ids

    def drop(self, block: int) -> None:
        """Forget a leaf block (its pages were released by the caller)."""
        assert self.alive[block] and self.children[block] == 0, "only leaves are dropped"
        parent = int(self.parent[block])
        if parent != NO_BLOCK:
            self.children[parent] -= 1
        self.alive[block] = False
        self.point[block] = False
        self.free.append(block)
        self.live -= 1

    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (self.key, self.parent, self.position, self.children,
                                           self.last_access, self.alive, self.point, self.prefix_pages,
                                           self.window_pages, self.tail_pages))
