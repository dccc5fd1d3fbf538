"""The host tier's memory: named byte extents in one preallocated arena with a fixed budget.

The arena is allocated once (`budget_bytes`, rounded up to 4,096), page
aligned; records take 4,096-byte aligned extents, first fit from an ordered
free list that is coalesced on every free, so nothing grows after
construction.  `put` copies a record in (TierFull, nothing changed, when no
extent is large enough), `reserve` hands out a record's extent to fill in
place, `view` returns a read-only view of its bytes (no copy), `image` the
whole extent (the bytes, then zeros to 4,096: what O_DIRECT writes straight to
disk), `get` a copy, `drop` frees it.
"""

from __future__ import annotations

import bisect

import numpy as np
from numpy.typing import NDArray

from hkv_core.errors import TierError, TierFull
from hkv_core.tiers.record import ALIGN_BYTES, padded

TIER = "host"


class HostArena:
    """Named byte records in a fixed arena (see the module docstring): the host tier's memory (host_store.py)
    and the remote tier's staging."""

    def __init__(self, budget_bytes: int) -> None:
        size = padded(int(budget_bytes))
        raw = np.empty(size + ALIGN_BYTES, np.uint8)  # numpy's allocation: huge pages where the kernel offers them
        start = -raw.ctypes.data % ALIGN_BYTES
        self.arena = raw[start:start + size]  # page aligned: extents can go to disk with O_DIRECT
        self.arena.fill(0)  # committed now, not at the first offload (preallocated means resident)
        self.budget = size
        self.free: list[tuple[int, int]] = [(0, size)] if size else []  # (start, length), ordered by start
        self.records: dict[str, tuple[int, int]] = {}  # name -> (start, bytes)
        self.used_bytes = 0  # the records' extents (padded), kept as they come and go

    def put(self, name: str, data: bytes | NDArray[np.uint8]) -> None:
        """Copy `data` in as record `name` (replacing one of that name); TierFull when no extent fits."""
        src = np.frombuffer(data, np.uint8) if isinstance(data, bytes | bytearray) else data.reshape(-1).view(np.uint8)
        np.copyto(self.reserve(name, src.size), src)

    def reserve(self, name: str, nbytes: int) -> NDArray[np.uint8]:
        """The writable extent of a record `name` of `nbytes` (replacing one of that name), its padding zeroed;
        TierFull, nothing changed, when no extent fits."""
        need = padded(nbytes)
        old = self.records.get(name)
        if old is not None and padded(old[1]) >= need:  # rewrite in place; a shorter record frees its tail
            start = old[0]
            if padded(old[1]) > need:
                self._release(start + need, padded(old[1]) - need)
        else:
            at = next((i for i, (_, length) in enumerate(self.free) if length >= need), -1)
            if at < 0:
                raise TierFull(tier=TIER, record=name, needed=need, free=self.largest_free, budget=self.budget)
            start, length = self.free[at]
            if length == need:
                del self.free[at]
            else:
                self.free[at] = (start + need, length - need)
            if old is not None:
                self._release(*old)
        self.arena[start + nbytes:start + need] = 0
        self.used_bytes += need - (padded(old[1]) if old is not None else 0)
        self.records[name] = (start, nbytes)
        return self.arena[start:start + nbytes]

    def view(self, name: str) -> NDArray[np.uint8]:
        """The record's bytes, read-only and without a copy (valid until it is dropped or replaced)."""
        start, size = self._find(name)
        out = self.arena[start:start + size]
        out.flags.writeable = False
        return out

    def image(self, name: str) -> NDArray[np.uint8]:
        """The record's whole extent, read-only: its bytes, then zeros to a multiple of 4,096."""
        start, size = self._find(name)
        out = self.arena[start:start + padded(size)]
        out.flags.writeable = False
        return out

    @property
    def largest_free(self) -> int:
        """The longest free extent, in bytes."""
        return max((length for _, length in self.free), default=0)

    def get(self, name: str) -> bytes:
        return self.view(name).tobytes()

    def drop(self, name: str) -> None:
        start, size = self._find(name)
        self._release(start, size)
        self.used_bytes -= padded(size)
        del self.records[name]

    def _find(self, name: str) -> tuple[int, int]:
        found = self.records.get(name)
        if found is None:
            raise TierError(tier=TIER, record=name, reason="no such record")
        return found

    def _release(self, start: int, size: int) -> None:
        """Give an extent back, merging it with free neighbours."""
        length = padded(size)
        at = bisect.bisect_left(self.free, (start, 0))
        if at < len(self.free) and self.free[at][0] == start + length:  # merge with the next
            length += self.free.pop(at)[1]
        if at > 0 and sum(self.free[at - 1]) == start:  # merge with the previous
            start, length = self.free[at - 1][0], self.free[at - 1][1] + length
            at -= 1
            del self.free[at]
        self.free.insert(at, (start, length))
        assert start % ALIGN_BYTES == 0 and length % ALIGN_BYTES == 0
