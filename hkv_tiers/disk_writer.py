"""Durable disk batches written on a worker thread and settled on the caller's thread.

`submit` hands a batch of records to the writer thread, which computes the
payload checksums the host tier leaves unsummed and publishes the batch
(`DiskStore.put_many`: all or none); the caller keeps its source copies until `reap` reports
the batch settled, so a record is always readable somewhere while it moves.
Batches settle in submission order; a batch's exception (TierError, or the
injected Crash) is returned with it, never lost.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import attrs
import numpy as np

from hkv_core.tiers.record import HEADER_BYTES, UNSUMMED, RecordHeader, checksum
from hkv_tiers.disk_store import DiskStore
from hkv_tiers.record_check import Buffer

Record = tuple[str, RecordHeader, Buffer]  # name, header, the payload or the record's whole image


def record_bytes(records: list[Record]) -> int:
    """Bytes a batch takes on disk (headers and padding included)."""
    return sum(header.record_bytes for _, header, _ in records)


class DiskWriter:
    """One writer thread for a DiskStore; `pending_bytes` counts batches submitted and not yet reaped."""

    def __init__(self, disk: DiskStore) -> None:
        self.disk = disk
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hkv-write")
        self.pending: deque[tuple[Future[None], list[str], int]] = deque()

    @property
    def pending_bytes(self) -> int:
        return sum(nbytes for _, _, nbytes in self.pending)

    def submit(self, records: list[Record]) -> None:
        future = self.pool.submit(self._publish, records)
        self.pending.append((future, [name for name, _, _ in records], record_bytes(records)))

    def _publish(self, records: list[Record]) -> None:
        """On the writer thread: checksum what the host left unsummed, then publish the batch durably."""
        summed = []
        for name, header, data in records:
            if header.payload_checksum == UNSUMMED:
                view = np.frombuffer(data, np.uint8)
                payload = view[HEADER_BYTES:HEADER_BYTES + header.payload_bytes] if len(view) > header.payload_bytes \
                    else view
                header = attrs.evolve(header, payload_checksum=checksum(payload))
            summed.append((name, header, data))
        self.disk.put_many(summed)

    def reap(self, wait: bool = False) -> list[tuple[list[str], BaseException | None]]:
        """Settled batches, oldest first: their names and exception (None: published).  With `wait`, at least
        the oldest pending batch is waited for."""
        out = []
        while self.pending and (wait or self.pending[0][0].done()):
            future, names, _ = self.pending.popleft()
            out.append((names, future.exception()))
            wait = False
        return out

    def drain(self) -> list[tuple[list[str], BaseException | None]]:
        """Wait for every pending batch."""
        out = []
        while self.pending:
            out += self.reap(wait=True)
        return out

    def stop(self) -> None:
        """Stop the thread: batches not started are cancelled, a running one finishes (durable or not)."""
        self.pool.shutdown(wait=True, cancel_futures=True)
