"""The interface every tier's record store offers: host (host_store.py), disk (disk_store.py) and remote
(remote_store.py).

A store holds records by name (record_check.record_name): a header (hkv_core.tiers.record) and a payload.
`put` stores one, `holds` says which of some names it has, `fetch` returns each wanted record's payload
only once it checks against what the load wants (layout, kind, ABI id, token range, key, length, checksum:
record_check.check_record) - a record that fails is never returned - `remove` deletes one, `close` lets go
of what the store holds open.  TierCache reaches each tier through this interface; what differs is when a
put takes effect: at once on the host, once durable on disk, once a worker has put it on the remote store
(`RemoteStore.drain` waits for it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from hkv_core.tiers.record import RecordHeader
from hkv_tiers.record_check import Buffer, Loaded, Wanted


@runtime_checkable
class Store(Protocol):
    """A tier's records by name (see the module docstring)."""

    @property
    def tier(self) -> str:
        """"host", "disk" or "remote": what counts and errors name."""
        ...

    @property
    def budget(self) -> int:
        """The bytes this store may use here (the remote store: its staging arena)."""
        ...

    @property
    def used_bytes(self) -> int:
        ...

    def put(self, name: str, header: RecordHeader, payload: Buffer) -> None:
        """Store record `name` (TierFull, nothing changed, when it cannot fit; the remote store counts a skipped
        put instead: it is a shared cache)."""
        ...

    def holds(self, names: Sequence[str]) -> set[str]:
        """Which of `names` this store holds."""
        ...

    def fetch(self, wanted: Sequence[Wanted]) -> list[Loaded | None]:
        """Each wanted record's checked payload `(tier, payload view, seconds)`, or None: not held or failing a
        check (never served)."""
        ...

    def remove(self, name: str) -> None:
        """Delete record `name` (nothing when it is not held)."""
        ...

    def close(self) -> None:
        ...
