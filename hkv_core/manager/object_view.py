"""ObjectView: the GuardView of a bulk lifecycle step over objects of the page pools.

Every answer is read from data: the page pools' arrays, and (for rows and
leases) the request table: an object's rows are written once its owner's
committed watermark passes its `row_token` / `full_token`, and are no longer
ahead once its owner's known tokens pass its `row_token`; a request's lease
lists the objects in its pin list.  Answers are arrays (one element per
object) except `slot_available`, one verdict for the whole step.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from hkv_core.arrays import all_true
from hkv_core.manager.object_table import ObjectTable

Index = NDArray[np.intp]


class ObjectView:
    """GuardView over `objs`, `actor` acting (a request slot, or -1)."""

    __slots__ = ("pools", "objs", "actor", "_owners")

    def __init__(self, pools: ObjectTable, objs: Index, actor: int) -> None:
        self.pools, self.objs, self.actor = pools, objs, actor
        self._owners: NDArray[np.int32] | None = None

    def owners(self) -> NDArray[np.int32]:
        """The objects' owners (gathered once per view: several guards read them)."""
        if self._owners is None:
            self._owners = self.pools.owner[self.objs]
        return self._owners

    def slot_available(self) -> bool:
        """Each pool's space has a free page for every one of the step's objects that draws from it."""
        p = self.pools
        runs = p.runs
        if runs is not None and runs[0] is self.objs:  # the step's split by pool is known (reserve): no counting
            if not p.spaces:
                return all(part.size <= pool.free_slot_count for pool, part in runs[1])
            return sum(part.size for _, part in runs[1]) <= p.spaces[0].count  # one space for all
        wanted = np.bincount(p.pool[self.objs], minlength=len(p.pools))
        if p.spaces:
            return int(wanted.sum()) <= p.spaces[0].count
        free = np.array([pool.free_slot_count for pool in p.pools])
        return bool(all_true(wanted <= free))

    def is_owner(self) -> NDArray[np.bool_]:
        owned: NDArray[np.bool_] = self.owners() == self.actor
        return owned

    def rows_full(self) -> NDArray[np.bool_]:
        p = self.pools
        full: NDArray[np.bool_] = p.requests.committed[self.owners()] >= p.full_token[self.objs]
        return full

    def tokens_known(self) -> NDArray[np.bool_]:
        """The owner knows the tokens each object's first row needs (its row token is within them)."""
        p = self.pools
        known: NDArray[np.bool_] = p.requests.known[self.owners()] >= p.row_token[self.objs]
        return known

    def rows_written(self) -> NDArray[np.int64]:
        p = self.pools
        written: NDArray[np.int64] = p.requests.committed[self.owners()] - p.row_token[self.objs] + 1
        return np.maximum(written, 0)

    def leased_by_actor(self) -> NDArray[np.bool_]:
        return self.pools.lease_mark(self.pools.requests.pinned(self.actor), self.objs)

    def lease_count(self) -> NDArray[np.int32]:
        return self.pools.leases[self.objs]

    def copy_pinned(self) -> NDArray[np.bool_]:
        pinned: NDArray[np.bool_] = self.pools.copies[self.objs] > 0
        return pinned

    def holders(self) -> NDArray[np.int32]:
        return self.pools.holders[self.objs]

    def loads_in_flight(self) -> NDArray[np.int32]:
        """Tier loads in flight that write each object (a target settles with its load, never before)."""
        return self.pools.loads[self.objs]

    def _index_question(self) -> NDArray[np.bool_]:
        raise AssertionError("a question about index entries or tier loads asked of device objects")

    targets_filling = parent_indexed = children = _index_question
    chain_tail = has_point = block_indexed = _index_question
