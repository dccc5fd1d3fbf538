"""PoolView: the GuardView of a bulk lifecycle step over objects of one page pool.

Every answer is read from data: the pool's arrays, and (for rows and leases)
the request table: an object's rows are written once its owner's committed
watermark passes its `row_token` / `full_token`; a request's lease lists the
objects in its pin list.  Answers are arrays (one element per object) except
`slot_available`, a single verdict for the whole step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from hkv_core.manager.page_pool import PagePool

Index = NDArray[np.intp]


class PoolView:
    """GuardView over `objs` of `pool`, `actor` acting (a request slot, or -1)."""

    __slots__ = ("pool", "objs", "actor")

    def __init__(self, pool: PagePool, objs: Index, actor: int) -> None:
        self.pool, self.objs, self.actor = pool, objs, actor

    def slot_available(self) -> bool:
        return self.pool.free_slot_count >= self.objs.size

    def is_owner(self) -> NDArray[np.bool_]:
        return np.asarray(self.pool.owner[self.objs] == np.int32(self.actor))

    def rows_full(self) -> NDArray[np.bool_]:
        pool = self.pool
        return np.asarray(pool.requests.committed[pool.owner[self.objs]] >= pool.full_token[self.objs])

    def rows_written(self) -> NDArray[np.int64]:
        pool = self.pool
        written: NDArray[np.int64] = pool.requests.committed[pool.owner[self.objs]] - pool.row_token[self.objs] + 1
        return np.maximum(written, 0)

    def leased_by_actor(self) -> NDArray[np.bool_]:
        pinned = self.pool.requests.pinned(self.actor, self.pool.spec.index)
        return self.pool.lease_mark(pinned, self.objs)

    def lease_count(self) -> NDArray[np.int32]:
        return self.pool.leases[self.objs]

    def copy_pinned(self) -> NDArray[np.bool_]:
        return np.asarray(self.pool.copies[self.objs] > 0)

    def holders(self) -> NDArray[np.int32]:
        return self.pool.holders[self.objs]

    def disk_record_durable(self) -> NDArray[np.bool_]:
        from hkv_core.manager.page_pool import DISK_DURABLE

        return np.asarray(self.pool.record[self.objs] == DISK_DURABLE)

    def _index_question(self) -> NDArray[np.bool_]:
        raise AssertionError(f"{self.pool.name}: a question about index entries or records asked of device objects")

    source_set_complete = disk_dependents = parent_indexed = children = _index_question
    chain_tail = has_point = block_indexed = _index_question
