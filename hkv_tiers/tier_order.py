"""A tier's eviction order, kept by the device's eviction policy (hkv_core/manager/index/policy.py).

The prefix index orders block rows; a tier holds named records (record_check.record_name: a block key, `-p`
after a point record's).  TierOrder gives every record a row of its own and a key (a digest of its name,
what the adaptive policy's ghost table and shadow samples read), and runs the policy `eviction` names
(`lru` or `adaptive`, as `ManagerConfig.eviction`: one choice for the device and its tiers).

Dependency aware as the index is: `touch(names)` takes one prefix's records root first, the way the index
touches a chain, and both policies keep children first, so a prefix's tail leaves a tier before its head, and a
block's point record (next to it in the chain) leaves with it.  `add(names)` enters records one at a time in
the given order (a batch moved from another tier: the first is the least recent).

The table grows by doubling when every row is taken: the records are re-entered one at a time in their
eviction order (LRU's order is kept exactly; an adaptive policy keeps the order and learns its rates again).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
from numpy.typing import NDArray

from hkv_core.errors import InvalidArgument
from hkv_core.manager.config import EVICTIONS
from hkv_core.manager.index.eviction import build_policy
from hkv_core.manager.index.policy import EvictionPolicy

FIRST_ROWS = 1024  # rows of a new order (it doubles when full)


def record_key(name: str) -> NDArray[np.uint64]:
    """A record's policy key: 16 bytes of BLAKE2b over its name (a block record and its point differ)."""
    return np.frombuffer(hashlib.blake2b(name.encode(), digest_size=16).digest(), "<u8").astype(np.uint64)


class TierOrder:
    """The records of one tier in eviction order (iteration: the next to leave first); see the module docstring.

    Supports `name in order`, `len(order)`, `iter(order)`, `del order[name]` and `clear()`.
    """

    def __init__(self, eviction: str = EVICTIONS[0], rows: int = FIRST_ROWS) -> None:
        if eviction not in EVICTIONS:
            raise InvalidArgument(action="TierOrder", argument="eviction", value=eviction,
                                  reason=f"the choices: {', '.join(EVICTIONS)}")
        self.eviction = eviction
        self._reset(max(1, int(rows)))

    def _reset(self, rows: int) -> None:
        self.row_of: dict[str, int] = {}
        self.name_of: list[str | None] = [None] * rows
        self.keys = np.zeros((rows, 2), np.uint64)
        self.free = list(range(rows - 1, -1, -1))  # popped from the end: row 0 first
        self.policy: EvictionPolicy = build_policy(self.eviction, rows, self.keys)
        assert self.policy.children_first, "a tier drops a prefix's tail before its head"

    @property
    def rows(self) -> int:
        return len(self.name_of)

    def __contains__(self, name: object) -> bool:
        return name in self.row_of

    def __len__(self) -> int:
        return len(self.row_of)

    def __iter__(self) -> Iterator[str]:
        """Names in eviction order, the next to leave first: a snapshot of the order now (a policy's queue may
        compact, and the table grow, under a lazy walk and reorder what it has not reached)."""
        rows = [row for chunk in self.policy.chunks() for row in chunk.tolist()]
        return iter([name for row in rows if (name := self.name_of[row]) is not None])

    def touch(self, names: Sequence[str]) -> None:
        """One prefix's records, root first, used now: the held ones become the most recent, deepest first
        (so the root ends most recent); names this tier does not hold are skipped, a repeated name counts
        where it first appears."""
        rows = [self.row_of[name] for name in dict.fromkeys(names) if name in self.row_of]
        if rows:
            self.policy.touch(np.asarray(rows, np.int32))

    def add(self, names: Iterable[str]) -> None:
        """Records entering this tier, one at a time in order (the first ends least recent of them); one
        already held is left where it is."""
        for name in names:
            if name in self.row_of:
                continue
            if not self.free:
                self._grow()
            row = self.free.pop()
            self.row_of[name], self.name_of[row] = row, name
            self.keys[row] = record_key(name)
            self.policy.touch(np.array([row], np.int32))

    def __delitem__(self, name: str) -> None:
        row = self.row_of.pop(name)  # KeyError for a record this tier does not hold, as a dict's
        self.policy.forget(np.array([row], np.int32))
        self.name_of[row] = None
        self.free.append(row)

    def clear(self) -> None:
        self._reset(self.rows)

    def _grow(self) -> None:
        order = list(self)
        self._reset(2 * self.rows)
        self.add(order)
