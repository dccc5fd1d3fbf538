"""Eviction order of the prefix index: the EvictionPolicy interface and exact LRU.

The index asks its policy for blocks in eviction order, a chunk at a time;
the eviction planner (hkv_core/manager/evict.py) takes units from the
front.  A policy that keeps `children_first` promises that every block comes
after all of its descendants, blocks of live chains aside (they are never
dropped), so one pass in its order meets each block when it is already a
leaf if it ever will be.

`LruPolicy`: an append-only queue of block ids; a block's entry is current
while `pos[block]` points at it, older entries are stale and skipped (and
dropped when the queue is compacted).  `touch(chain)` appends a chain's
blocks deepest first, so children precede parents.  Capacity is fixed:
`limits.queue_entries` (block rows + a quarter; a compaction keeps at most
one entry per live block, chains kept whole).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.limits import MAX_QUEUE_CHUNK_ENTRIES, QUEUE_CHUNK_ENTRIES, queue_entries

if TYPE_CHECKING:
    from hkv_core.manager.index.blocks import BlockTable

Blocks = NDArray[np.int32]


class EvictionPolicy(Protocol):
    """What the index needs from an eviction order."""

    children_first: bool

    def touch(self, chain: Blocks) -> None:
        """Blocks of one chain (root first) were used now."""
        ...

    def forget(self, blocks: Blocks) -> None:
        """Blocks left the index."""
        ...

    def holds(self, blocks: Blocks) -> NDArray[np.bool_]:
        """Which of `blocks` the order holds (a live request's new blocks join it when the request ends)."""
        ...

    def chunks(self) -> Iterator[Blocks]:
        """Live blocks in eviction order, a chunk at a time (chunks grow)."""
        ...

    def clone(self, blocks: BlockTable) -> EvictionPolicy:
        """An independent copy, for an index whose block table is `blocks` (a policy that reads the table
        reads that one from then on)."""
        ...


class LruPolicy:
    """Exact LRU, deepest first within a chain: see the module docstring."""

    children_first = True

    def __init__(self, block_rows: int) -> None:
        self.queue = np.zeros(queue_entries(block_rows), np.int32)
        self.pos = np.full(block_rows, -1, np.int32)
        self.head = 0  # entries before the head are all stale
        self.length = 0

    def touch(self, chain: Blocks) -> None:
        count = len(chain)
        if not count:
            return
        if self.length + count > len(self.queue):
            self.pos[chain] = -1  # re-entered below: their old entries go with the compaction
            self._compact()
        assert self.length + count <= len(self.queue), "one entry per live block fits, with the chain's"
        end = self.length + count
        deepest_first = chain[::-1].astype(np.intp)  # (an intp index scatters faster than int32)
        self.queue[self.length:end] = deepest_first
        self.pos[deepest_first] = np.arange(self.length, end, dtype=np.int32)
        self.length = end

    def forget(self, blocks: Blocks) -> None:
        self.pos[blocks] = -1

    def holds(self, blocks: Blocks) -> NDArray[np.bool_]:
        return np.asarray(self.pos[blocks] >= 0)

    def current(self, start: int, end: int) -> NDArray[np.bool_]:
        """Which queue entries in [start, end) are current (their block's latest touch)."""
        blocks = self.queue[start:end]
        return np.asarray(self.pos[blocks] == np.arange(start, end))

    def chunks(self) -> Iterator[Blocks]:
        start, size, leading_stale = self.head, QUEUE_CHUNK_ENTRIES, True
        while start < self.length:
            end = min(start + size, self.length)
            size = min(2 * size, MAX_QUEUE_CHUNK_ENTRIES)  # long live chains at the front: O(log) rounds
            current = self.current(start, end)
            if leading_stale:
                first = int(np.argmax(current)) if current.any() else end - start
                self.head, leading_stale = start + first, first == end - start
            yield self.queue[start:end][current]
            start = end

    def order(self) -> Blocks:
        """Every current entry, front first (for checks and snapshots)."""
        live = self.queue[self.head:self.length]
        return live[self.current(self.head, self.length)]

    def _compact(self) -> None:
        keep = self.order()
        self.queue[:len(keep)] = keep
        self.pos[keep] = np.arange(len(keep), dtype=np.int32)
        self.head, self.length = 0, len(keep)

    def clone(self, blocks: BlockTable | None = None) -> LruPolicy:
        twin = LruPolicy.__new__(LruPolicy)
        twin.queue, twin.pos = self.queue.copy(), self.pos.copy()
        twin.head, twin.length = self.head, self.length
        return twin
