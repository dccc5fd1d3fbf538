"""Belady's offline optimum as an EvictionPolicy: evict the block whose next use lies farthest ahead.

Only a replay can use it: before each release it tells the policy, for every
block of the request's chain, the index of the next request that uses it
(`hint`).  Order: next use descending (never again first), then touch
sequence ascending.  It keeps the index's rule that children come before
their parents: a child is used only with its parent, so its next use is never
earlier; and every touch numbers a chain deepest first, so a child's last
touch number is below its parent's.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.index.blocks import BlockTable

Blocks = NDArray[np.int32]
NEVER = np.iinfo(np.int64).max  # the next use of a block no later request needs


class BeladyPolicy:
    """Farthest next use first (see the module docstring)."""

    children_first = True

    def __init__(self, block_rows: int) -> None:
        self.live = np.zeros(block_rows, np.bool_)
        self.next_use = np.full(block_rows, NEVER, np.int64)
        self.seq = np.zeros(block_rows, np.int64)
        self.clock = 0

    def hint(self, chain: Blocks, next_use: NDArray[np.int64]) -> None:
        """The next request using each block of `chain` (NEVER: none)."""
        self.next_use[chain] = next_use

    def touch(self, chain: Blocks) -> None:
        n = len(chain)
        self.live[chain] = True
        self.seq[chain[::-1]] = np.arange(self.clock, self.clock + n)  # deepest first
        self.clock += n

    def forget(self, blocks: Blocks) -> None:
        self.live[blocks] = False
        self.next_use[blocks] = NEVER

    def holds(self, blocks: Blocks) -> NDArray[np.bool_]:
        return np.asarray(self.live[blocks])

    def order(self) -> Blocks:
        blocks = np.flatnonzero(self.live).astype(np.int32)
        return blocks[np.lexsort((self.seq[blocks], -self.next_use[blocks]))]

    def chunks(self) -> Iterator[Blocks]:
        yield self.order()

    def clone(self, blocks: BlockTable | None = None) -> BeladyPolicy:
        twin = BeladyPolicy.__new__(BeladyPolicy)
        twin.live, twin.next_use, twin.seq = self.live.copy(), self.next_use.copy(), self.seq.copy()
        twin.clock = self.clock
        return twin
