"""The host tier: records of one layout in a preallocated arena (host_arena.py), each header kept parsed beside
its bytes.

A record's extent holds its packed header, then its payload (what O_DIRECT writes straight to disk when the
record moves there: `image`).  `reserve(name, header)` hands out the payload's place to fill in place;
`fetch` checks every record against what the load wants before it returns a view of it (its payload checksum
too, unless it was never computed: host records live in process memory, trusted like the device pools, and
the disk writer computes the sum on the way down).  A record that fails is left where it is for the caller
to drop (TierCache: it may be on its way to disk).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from hkv_core.errors import InvalidArgument, RecordCorrupt
from hkv_core.tiers.record import HEADER_BYTES, UNSUMMED, RecordHeader, pack_header
from hkv_tiers.host_arena import TIER, HostArena
from hkv_tiers.record_check import Buffer, Loaded, Wanted, check_record


class HostStore:
    """The host tier's records (see the module docstring): a Store (store.py)."""

    tier = TIER

    def __init__(self, budget_bytes: int, *, fingerprint: str, abi_id: str) -> None:
        self.arena = HostArena(budget_bytes)
        self.fingerprint, self.abi_id = fingerprint, abi_id
        self.headers: dict[str, RecordHeader] = {}  # each record's header, as packed into its extent

    @property
    def budget(self) -> int:
        return self.arena.budget

    @property
    def used_bytes(self) -> int:
        return self.arena.used_bytes

    @property
    def largest_free(self) -> int:
        return self.arena.largest_free

    def __contains__(self, name: object) -> bool:
        return name in self.headers

    def __len__(self) -> int:
        return len(self.headers)

    def reserve(self, name: str, header: RecordHeader) -> NDArray[np.uint8]:
        """The writable payload of a new record `name` (header packed in front of it); TierFull, nothing
        changed, when no extent fits.  Fill it before the next call, or `remove` it."""
        packed = np.frombuffer(pack_header(header), np.uint8)  # before the extent: a bad header takes nothing
        image = self.arena.reserve(name, HEADER_BYTES + header.payload_bytes)
        image[:HEADER_BYTES] = packed
        self.headers[name] = header
        return image[HEADER_BYTES:]

    def put(self, name: str, header: RecordHeader, payload: Buffer) -> None:
        """InvalidArgument, nothing changed, when `payload` is not `header.payload_bytes` long."""
        src = np.frombuffer(payload, np.uint8)
        if len(src) != header.payload_bytes:
            raise InvalidArgument(action="HostStore.put", argument="payload", value=f"{len(src):,} bytes",
                                  reason=f"the header says {header.payload_bytes:,}")
        np.copyto(self.reserve(name, header), src)

    def header(self, name: str) -> RecordHeader:
        return self.headers[name]

    def image(self, name: str) -> NDArray[np.uint8]:
        """The record's whole extent, read-only: header, payload, zeros to a multiple of 4,096."""
        return self.arena.image(name)

    def holds(self, names: Sequence[str]) -> set[str]:
        return {name for name in names if name in self.headers}

    def fetch(self, wanted: Sequence[Wanted]) -> list[Loaded | None]:
        return [self._read(want) if want.name in self.headers else None for want in wanted]

    def _read(self, want: Wanted) -> Loaded | None:
        began, header = time.perf_counter(), self.headers[want.name]
        payload = self.arena.view(want.name)[HEADER_BYTES:HEADER_BYTES + header.payload_bytes]  # a view
        try:
            check_record(TIER, header, payload, want, fingerprint=self.fingerprint, abi_id=self.abi_id,
                         checked=header.payload_checksum == UNSUMMED)
        except RecordCorrupt:
            return None
        return TIER, payload, time.perf_counter() - began

    def remove(self, name: str) -> None:
        if self.headers.pop(name, None) is not None:
            self.arena.drop(name)

    def close(self) -> None:
        """Nothing to let go: the arena is process memory."""
