"""EventLog: the prefix index's record of what it stored and removed, until someone takes it.

The index appends one record per change - the arrays copied and a function
that turns them into events later - so that the request path pays a few
copies and no Python loop per block; `take` turns the records into the
typed events of `hkv_core.events`, in order.  A record is one commit's
stored blocks, one commit's resume points, or one eviction's dropped points
or dropped blocks.  At most `capacity` records wait: the oldest beyond that
are dropped and counted, and the next `take` starts with `EventsLost(count)`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from hkv_core.block_keys import key_bytes, keys_bytes
from hkv_core.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventsLost,
    KVEvent,
    ResumePointRemoved,
    ResumePointStored,
)

Keys = NDArray[np.uint64]
Record = Callable[[], list[KVEvent]]  # the events of one change, built when they are taken


class EventLog:
    """Records of index changes, at most `capacity` of them (see the module docstring)."""

    def __init__(self, capacity: int, block_tokens: int) -> None:
        assert capacity >= 1
        self.capacity, self.block_tokens = capacity, block_tokens
        self.records: deque[Record] = deque()
        self.lost = 0

    def _append(self, record: Record) -> None:
        if len(self.records) == self.capacity:
            self.records.popleft()
            self.lost += 1
        self.records.append(record)

    def stored(self, keys: Keys, parent: Keys | None, tokens: NDArray[np.int64], lora: str | int | None) -> None:
        """Consecutive blocks `keys` under the block whose key is `parent` (None: a root), over `tokens`."""
        keys, tokens, size = keys.copy(), tokens.copy(), self.block_tokens
        parent_hash = None if parent is None else key_bytes(parent[None], 0)
        self._append(lambda: [BlockStored(
            block_hashes=keys_bytes(keys), parent_block_hash=parent_hash, token_ids=tuple(tokens.tolist()),
            block_size=size, lora_id=lora if isinstance(lora, int) else None,
            lora_name=lora if isinstance(lora, str) else None)])

    def removed(self, keys: Keys) -> None:
        keys = keys.copy()
        self._append(lambda: [BlockRemoved(block_hashes=keys_bytes(keys))])

    def points_stored(self, keys: Keys, positions: NDArray[np.integer]) -> None:
        keys, at = keys.copy(), np.asarray(positions, np.int64).tolist()
        self._append(lambda: [ResumePointStored(block_hash=h, position_tokens=p)
                              for h, p in zip(keys_bytes(keys), at, strict=True)])

    def points_removed(self, keys: Keys) -> None:
        keys = keys.copy()
        self._append(lambda: [ResumePointRemoved(block_hashes=keys_bytes(keys))])

    def cleared(self) -> None:
        """Everything left the index (its removals were not recorded one by one)."""
        self._append(lambda: [AllBlocksCleared()])

    def take(self) -> list[KVEvent]:
        """The events recorded since the last call, oldest first; the log is empty afterwards."""
        events: list[KVEvent] = [EventsLost(count=self.lost)] if self.lost else []
        for record in self.records:
            events += record()
        self.records.clear()
        self.lost = 0
        return events

    def clone(self) -> EventLog:
        twin = EventLog(self.capacity, self.block_tokens)
        twin.records, twin.lost = deque(self.records), self.lost  # records are never changed in place
        return twin
