"""Per-block metadata of the prefix index, in growable NumPy columns.

One row per indexed block: its 128-bit key, parent block, position, child
count, place in the LRU queue, and per pool the page covering it (prefix
pools), its window page (window pools, NULL unless a retained resume point
needs it) and, when a resume point is retained at the block's end, its tail
snapshot pages.  About 40-90 bytes per block depending on the layout (README).

The LRU queue is an append-only array of block ids in eviction order; a
block's entry is current while `lru_pos[block]` points at it, older entries
are stale and skipped (and dropped when the queue is compacted).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.pools import NULL_PAGE

NO_BLOCK = -1
MIN_BLOCKS = 256
MIN_QUEUE = 1024


class BlockArena:
    """Columns indexed by block id; ids are recycled through a free stack."""

    def __init__(self, prefix_pools: int, window_pools: int, tail_pools: int) -> None:
        self.widths = (prefix_pools, window_pools, tail_pools)
        self.capacity = 0
        self.free: list[int] = []
        self.live = 0
        self._grow(MIN_BLOCKS)
        self.lru_block = np.zeros(MIN_QUEUE, np.int32)  # the LRU queue (see the module docstring)
        self.lru_head = 0  # entries before the head are all stale
        self.lru_len = 0

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
        self.lru_pos = grown(get("lru_pos"), (capacity,), np.int32, -1)  # its current LRU queue entry
        self.alive = grown(get("alive"), (capacity,), np.bool_, 0)
        self.point = grown(get("point"), (capacity,), np.bool_, 0)
        self.prefix_pages = grown(get("prefix_pages"), (capacity, pw), np.int32, NULL_PAGE)
        self.window_pages = grown(get("window_pages"), (capacity, ww), np.int32, NULL_PAGE)
        self.tail_pages = grown(get("tail_pages"), (capacity, tw), np.int32, NULL_PAGE)
        self.free.extend(range(capacity - 1, old - 1, -1))
        self.capacity = capacity

    def add_chain(self, keys: NDArray[np.uint64], parent: int, position: int) -> NDArray[np.int32]:
        """New live blocks for consecutive keys, each the parent of the next; returns their ids (untouched)."""
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
        self.lru_pos[ids], self.alive[ids], self.point[ids] = -1, True, False
        self.prefix_pages[ids] = NULL_PAGE
        self.window_pages[ids] = NULL_PAGE
        self.tail_pages[ids] = NULL_PAGE
        if parent != NO_BLOCK:
            self.children[parent] += 1
        self.live += count
        return ids

    def touch(self, chain: NDArray[np.int32]) -> None:
        """Blocks of one chain (root first) were used now: their entries move to the back of the queue.

        Deepest first, so the queue stays ordered children before parents
        for every block that no live request's chain holds (a live chain is
        re-touched whole when its request is released).
        """
        count = len(chain)
        if not count:
            return
        if self.lru_len + count > len(self.lru_block):
            self._compact_queue(count)
        where = np.arange(self.lru_len, self.lru_len + count, dtype=np.int32)
        self.lru_block[where] = chain[::-1]
        self.lru_pos[chain[::-1]] = where
        self.lru_len += count

    def current(self, start: int, end: int) -> NDArray[np.bool_]:
        """Which queue entries in [start, end) are current (their block's latest touch)."""
        blocks = self.lru_block[start:end]
        return np.asarray(self.alive[blocks] & (self.lru_pos[blocks] == np.arange(start, end)))

    def _compact_queue(self, room: int) -> None:
        """Keep the current entries (in order); grow so that `room` more fit with slack."""
        keep = self.lru_block[self.lru_head:self.lru_len][self.current(self.lru_head, self.lru_len)]
        size = max(MIN_QUEUE, len(self.lru_block))
        while size < 2 * (len(keep) + room):
            size *= 2
        if size != len(self.lru_block):
            self.lru_block = np.zeros(size, np.int32)
        self.lru_block[:len(keep)] = keep
        self.lru_pos[keep] = np.arange(len(keep), dtype=np.int32)
        self.lru_head, self.lru_len = 0, len(keep)

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

    def drop_many(self, blocks: NDArray[np.int32]) -> None:
        """Forget blocks that are leaves once the ones before them in `blocks` are gone (children first)."""
        if not len(blocks):
            return
        assert np.all(self.alive[blocks]), "only live blocks are dropped"
        parents = self.parent[blocks]
        parents = parents[parents != NO_BLOCK]
        np.subtract.at(self.children, parents, 1)
        assert np.all(self.children[blocks] == 0), "only leaves are dropped"
        self.alive[blocks] = False
        self.point[blocks] = False
        self.free.extend(blocks.tolist())
        self.live -= len(blocks)

    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (self.key, self.parent, self.position, self.children,
                                           self.lru_pos, self.alive, self.point, self.prefix_pages,
                                           self.window_pages, self.tail_pages, self.lru_block))
