"""EventLog: the prefix index's record of what it stored and removed, until someone takes it.

The index appends one raw record per change (arrays copied, nothing
converted) so that the request path pays a few copies and no Python loop
per block; `take` turns the records into the typed events of
`hkv_core.events`, in order.  A record is one commit's stored blocks, one
commit's resume points, or one eviction's dropped points or dropped blocks.
At most `capacity` records wait: the oldest beyond that are dropped and
counted, and the next `take` starts with `EventsLost(count)`.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from numpy.typing import NDArray

from hkv_core.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventsLost,
    KVEvent,
    ResumePointRemoved,
    ResumePointStored,
)

KEY_BYTES = 16
Keys = NDArray[np.uint64]
Record = tuple[object, ...]


def hashes(keys: Keys) -> tuple[bytes, ...]:
    """Each (hi, lo) key as 16 bytes: its two words little-endian, hi first."""
    raw = np.ascontiguousarray(keys, dtype="<u8").tobytes()
    return tuple(raw[i:i + KEY_BYTES] for i in range(0, len(raw), KEY_BYTES))


class EventLog:
    """Raw records of index changes, at most `capacity` of them (see the module docstring)."""

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
        self._append(("stored", keys.copy(), None if parent is None else parent.copy(), tokens.copy(), lora))

    def removed(self, keys: Keys) -> None:
        self._append(("removed", keys.copy()))

    def points_stored(self, keys: Keys, positions: NDArray[np.integer]) -> None:
        self._append(("points", keys.copy(), np.asarray(positions, np.int64).copy()))

    def points_removed(self, keys: Keys) -> None:
        self._append(("points_removed", keys.copy()))

    def cleared(self) -> None:
        """Everything left the index (its removals were not recorded one by one)."""
        self._append(("cleared",))

    def take(self) -> list[KVEvent]:
        """The events recorded since the last call, oldest first; the log is empty afterwards."""
        events: list[KVEvent] = [EventsLost(count=self.lost)] if self.lost else []
        for record in self.records:
            events.extend(self._convert(record))
        self.records.clear()
        self.lost = 0
        return events

    def _convert(self, record: Record) -> list[KVEvent]:
        kind = record[0]
        if kind == "stored":
            keys, parent, tokens, lora = record[1:]
            assert isinstance(keys, np.ndarray) and isinstance(tokens, np.ndarray)
            assert parent is None or isinstance(parent, np.ndarray)
            return [BlockStored(block_hashes=hashes(keys),
                                parent_block_hash=None if parent is None else hashes(parent[None])[0],
                                token_ids=tuple(tokens.tolist()), block_size=self.block_tokens,
                                lora_id=lora if isinstance(lora, int) else None,
                                lora_name=lora if isinstance(lora, str) else None)]
        if kind == "points":
            keys, positions = record[1:]
            assert isinstance(keys, np.ndarray) and isinstance(positions, np.ndarray)
            return [ResumePointStored(block_hash=h, position_tokens=p)
                    for h, p in zip(hashes(keys), positions.tolist(), strict=True)]
        if kind == "cleared":
            return [AllBlocksCleared()]
        keys = record[1]
        assert isinstance(keys, np.ndarray)
        if kind == "removed":
            return [BlockRemoved(block_hashes=hashes(keys))]
        return [ResumePointRemoved(block_hashes=hashes(keys))]

    def clone(self) -> EventLog:
        twin = EventLog(self.capacity, self.block_tokens)
        twin.records, twin.lost = deque(self.records), self.lost
        return twin
