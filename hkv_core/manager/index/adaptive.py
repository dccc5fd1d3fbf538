"""An online eviction policy that learns from the workload: admission by learned reuse, then recency with a
frequency bonus whose strength miniature simulations choose.

The rule (docs/replay.md), with no knowledge of the future:

- Admission.  Every block inserted for the first time belongs to the bucket
  of its request (log2 of the request's output tokens, told by `hint`
  before the release).  The policy remembers the keys it has seen (a ghost
  table, bounded) and counts, per bucket, the new blocks and how many of
  them were used again later, cached or not.  A new block is admitted when
  its bucket's reuse rate (Laplace-smoothed) is at least `ADMIT_RATIO`
  times the rate over all buckets; otherwise it goes in declined, at the
  cold end of the order (evicted before every admitted block; declined
  blocks leave oldest first).
- Order.  The clock counts touched blocks; a block touched at `now` gets,
  for each candidate strength `beta` of `BETAS`, the priority `now + beta *
  C * uses / (1 + age / C)`: recency plus a bonus for its rate of use
  (uses before this one, over its age since first seen in cache turnovers
  of `C` blocks; both restored from the ghost table when an evicted key
  comes back).  Eviction takes the lowest priority of the chosen candidate
  first, the touch sequence breaking ties.
- Choice.  Shadow caches over a hash-sampled 1/16 of the keys, one per
  candidate, each 1/16 of the capacity (hkv_core/manager/index/shadow.py): the
  candidate whose shadow hit most so far orders the real cache.  Each
  candidate keeps its own priorities for every block, so a change of choice
  reorders the cache exactly as that candidate would.

Children before parents, under every candidate: a touch never lowers a
block's priority, and within the touched chain each block's priority is
raised to its descendants' (a reversed running maximum), so a parent's
priority is never below a child's; at equal priorities the child was touched
earlier (every touch numbers a chain deepest first).  A child's later
touches touch its parent too, so this holds until the child leaves.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.index.blocks import BlockTable
from hkv_core.manager.index.shadow import Shadows

Blocks = NDArray[np.int32]
BUCKETS = 24  # request buckets: log2 of the output tokens, the last one open-ended
ADMIT_RATIO = 0.5  # admit a bucket's new blocks when reused at least half as often as the average new block
BETAS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0)  # candidate strengths of the use-rate bonus (0: recency alone)
DECLINED = 1e12  # how far below the clock a declined block's priority starts (below every admitted block)
GHOST_PER_ROW = 8  # keys remembered per block row (at least MIN_GHOST_KEYS): seen keys, their uses, their bucket
MIN_GHOST_KEYS = 1 << 16  # the ghost table's smallest bound
NOT_PENDING = -1  # a block whose first reuse was counted (or is not a new block)


class AdaptivePolicy:
    """Admission by learned reuse, recency plus a use-rate bonus chosen by shadows (see the module docstring)."""

    children_first = True

    def __init__(self, block_rows: int, keys: NDArray[np.uint64]) -> None:
        self.keys = keys  # the block table's key column, read at touch (a clone shares it)
        self.live = np.zeros(block_rows, np.bool_)
        self.priority = np.zeros((len(BETAS), block_rows), np.float64)  # per candidate
        self.seq = np.zeros(block_rows, np.int64)
        self.uses = np.zeros(block_rows, np.int64)
        self.first = np.zeros(block_rows, np.int64)  # the clock when the block's key was first seen
        self.pending = np.full(block_rows, NOT_PENDING, np.int64)  # a new block's bucket until its first reuse
        self.row_key = np.zeros(block_rows, np.uint64)
        self.ghost: OrderedDict[int, tuple[int, int, int]] = OrderedDict()  # key -> (uses, pending, first)
        self.ghost_keys = max(GHOST_PER_ROW * block_rows, MIN_GHOST_KEYS)
        self.inserted = np.zeros(BUCKETS, np.float64)
        self.reused = np.zeros(BUCKETS, np.float64)
        self.bucket = 0
        self.clock = 0
        self.turnover = float(block_rows)  # C: the blocks the cache holds
        self.betas = np.array(BETAS)[:, None] * self.turnover
        self.shadows = Shadows(len(BETAS), block_rows)
        self.chosen = 0  # the candidate ordering the cache: the shadows' best at the last touch
        self.picks = np.zeros(len(BETAS), np.int64)  # touches ordered by each candidate (for reports and tests)

    def hint(self, output_tokens: int) -> None:
        """The next released request produced `output_tokens` tokens (its new blocks' bucket)."""
        self.bucket = min(max(0, int(output_tokens)).bit_length(), BUCKETS - 1)

    def admits(self, bucket: int) -> bool:
        """Whether new blocks of `bucket` are admitted: its reuse rate against the rate over all buckets."""
        rate = (self.reused[bucket] + 1) / (self.inserted[bucket] + 2)
        average = (self.reused.sum() + 1) / (self.inserted.sum() + 2)
        return bool(rate >= ADMIT_RATIO * average)

    def touch(self, chain: Blocks) -> None:
        n = len(chain)
        if not n:
            return
        fresh = chain[~self.live[chain]]
        if len(fresh):
            self._enter(fresh)
        self._count_reuse(chain)
        deepest_first = chain[::-1]
        proposed = self.proposed(deepest_first)
        sampled = self.shadows.sampled(self.keys[deepest_first, 1])
        if sampled.any():
            self.shadows.access(self.keys[deepest_first[sampled], 1].tolist(), proposed[:, sampled])
        self.chosen = self.shadows.best()
        self.picks[self.chosen] += 1
        old = np.where(self.live[deepest_first], self.priority[:, deepest_first], -np.inf)
        self.priority[:, deepest_first] = np.maximum.accumulate(np.maximum(old, proposed), axis=1)
        self.seq[deepest_first] = np.arange(self.clock, self.clock + n)
        self.clock += n
        self.live[chain] = True
        self.uses[chain] += 1

    def proposed(self, deepest_first: Blocks) -> NDArray[np.float64]:
        """Each candidate's priority for a chain touched now (candidates x blocks, deepest first), raised along
        the chain to the descendants' (a reversed running maximum): the shadows' priorities too."""
        uses = self.uses[deepest_first]
        now = float(self.clock)
        rate = uses / (1.0 + (now - self.first[deepest_first]) / self.turnover)  # uses per cache turnover
        proposed = now + self.betas * rate
        if not self.admits(self.bucket):
            proposed[:, uses == 0] = now - DECLINED
        return np.maximum.accumulate(proposed, axis=1)

    def _enter(self, rows: Blocks) -> None:
        """Rows new to the order: restore their keys' uses from the ghost table, or start them pending."""
        keys = self.keys[rows, 0]
        self.row_key[rows] = keys
        self.uses[rows] = 0
        self.pending[rows] = self.bucket
        self.first[rows] = self.clock
        for row, key in zip(rows.tolist(), keys.tolist(), strict=True):
            seen = self.ghost.pop(key, None)
            if seen is not None:
                self.uses[row], self.pending[row], self.first[row] = seen
        self.inserted[self.bucket] += int(np.count_nonzero(self.uses[rows] == 0))

    def _count_reuse(self, chain: Blocks) -> None:
        """Blocks used again for the first time: a reuse for the bucket that inserted them."""
        first = chain[(self.uses[chain] > 0) & (self.pending[chain] != NOT_PENDING)]
        if len(first):
            np.add.at(self.reused, self.pending[first], 1.0)
            self.pending[first] = NOT_PENDING

    def forget(self, blocks: Blocks) -> None:
        gone = blocks[self.live[blocks]]
        if not len(gone):
            return
        self.live[gone] = False
        for key, uses, pending, first in zip(self.row_key[gone].tolist(), self.uses[gone].tolist(),
                                             self.pending[gone].tolist(), self.first[gone].tolist(), strict=True):
            self.ghost[key] = (uses, pending, first)
        while len(self.ghost) > self.ghost_keys:
            self.ghost.popitem(last=False)  # O(1): a dict's first item costs a scan past deleted slots

    def holds(self, blocks: Blocks) -> NDArray[np.bool_]:
        return np.asarray(self.live[blocks])

    def order(self) -> Blocks:
        blocks = np.flatnonzero(self.live).astype(np.int32)
        return blocks[np.lexsort((self.seq[blocks], self.priority[self.chosen, blocks]))]

    def chunks(self) -> Iterator[Blocks]:
        yield self.order()

    def clone(self, blocks: BlockTable) -> AdaptivePolicy:
        twin = AdaptivePolicy.__new__(AdaptivePolicy)
        for name, value in vars(self).items():
            setattr(twin, name, value.copy() if isinstance(value, np.ndarray | dict) and name != "keys"
                    else value.clone() if isinstance(value, Shadows) else value)
        twin.keys = blocks.key  # the cloned index's key column, not this one's
        return twin
