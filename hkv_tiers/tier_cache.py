"""The host and disk tiers together: block records by key, demotion host -> disk, restart, counts.

Records are named by their block key (32 hex digits, `-p` after a point
record's) and hold a block's compressed entries or a resume point's window and
tails (span_io).  A new record goes to the host arena; when the arena is full the
host records first in eviction order move to disk in durable batches written on a
worker thread (readable on the host until they settle), and when the disk budget
is full the disk records first in eviction order are deleted.  Each tier's order
is kept by the eviction policy the manager runs (`eviction`: "lru" or
"adaptive"; tier_order.py).  A lookup touches a prefix's records root first, as
the index touches a chain, and the policies keep children first, so a tier drops
a prefix's tail before its head.  Loads of disk records run on worker threads, at most
`loads_in_flight` at a time.  Every record is checked when it is read (header,
layout, kind, ABI id, token range, key, payload checksum); one that fails is
quarantined, counted and treated as a miss - never served.

The directory (cache_dir.py) holds `cache.json` - whose cache it is - and a
lock: one cache per directory, reopened after `close()` or after a crash with
what survived.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hkv_core.errors import TierError, TierFull
from hkv_core.layout import PoolSpec
from hkv_core.manager.config import EVICTIONS
from hkv_core.tiers.record import HEADER_BYTES, UNSUMMED, RecordHeader
from hkv_tiers.cache_dir import RECORDS_DIR, CacheDirectory, checked_directory
from hkv_tiers.disk_store import Crash, DiskFaults, DiskStore
from hkv_tiers.disk_writer import DiskWriter, Record, record_bytes
from hkv_tiers.host_store import HostStore
from hkv_tiers.record_check import Buffer, Loaded, Wanted, record_name, span_abi_id
from hkv_tiers.remote_config import RemoteTierConfig
from hkv_tiers.remote_store import RemoteStore
from hkv_tiers.tier_order import TierOrder


class TierCache:
    """Host arena (`host_bytes`), with `directory` a disk store (`disk_bytes`), with `remote` a shared Mooncake
    Store (remote_store.py) of block records; `eviction` ("lru" or "adaptive") orders the host and disk tiers."""

    def __init__(self, *, pools: Sequence[PoolSpec], layout_fingerprint: str, model_id: str, key_seed: int,
                 host_bytes: int, directory: str | Path | None = None, disk_bytes: int = 0,
                 faults: DiskFaults | None = None, loads_in_flight: int = 4,
                 remote: RemoteTierConfig | None = None, eviction: str = EVICTIONS[0]) -> None:
        self.pools, self.fingerprint, self.abi_id = tuple(pools), layout_fingerprint, span_abi_id(pools)
        directory = checked_directory(directory, action="TierCache", argument="directory")  # before anything
        self.host_order = TierOrder(eviction)  # the policy `eviction` names orders each tier (tier_order.py)
        self.disk_order = TierOrder(eviction)
        try:
            self.host = HostStore(host_bytes, fingerprint=self.fingerprint, abi_id=self.abi_id)
        except (MemoryError, ValueError, OverflowError, OSError) as err:
            raise TierError(tier="host", record="arena", reason=f"cannot preallocate {host_bytes:,} bytes "
                            f"({type(err).__name__})") from None
        self.remote: RemoteStore | None = None
        self.counts: Counter[str] = Counter()
        self.directory = directory
        self.disk: DiskStore | None = None
        self.writer: DiskWriter | None = None
        self.moving: set[str] = set()  # records on their way to disk (host copy kept until the batch settles)
        self.claimed: CacheDirectory | None = None
        if self.directory is not None:
            self._open(model_id, key_seed, disk_bytes, faults)
        self.loader = ThreadPoolExecutor(max_workers=max(1, loads_in_flight), thread_name_prefix="hkv-load")
        if remote is not None:  # last: nothing after it can fail and leave its client open
            try:
                self.remote = RemoteStore(remote, fingerprint=self.fingerprint, abi_id=self.abi_id,
                                          model_id=model_id)
            except BaseException:
                self.abandon()  # the directory released, the threads stopped
                raise

    # ------------------------------------------------------------------ directory

    def _open(self, model_id: str, key_seed: int, disk_bytes: int, faults: DiskFaults | None) -> None:
        assert self.directory is not None
        self.claimed = CacheDirectory(self.directory)
        try:
            self.claimed.claim(self.fingerprint, model_id, key_seed)
            self.disk = DiskStore(self.directory / RECORDS_DIR, disk_bytes, self.fingerprint, faults=faults,
                                  abi_id=self.abi_id)
            self.writer = DiskWriter(self.disk)
        except OSError as err:
            self.abandon()
            raise TierError(tier="disk", record=str(self.directory), reason=f"cannot use the directory: "
                            f"{err.strerror}", errno=err.errno) from None
        except BaseException:
            self.abandon()
            raise
        self.disk_order.add(self.disk.names_by_age())  # least recently written first
        self.counts["restored"] += len(self.disk.sizes)

    def close(self) -> None:
        """Publish what is on its way to the remote store (within a few deadlines), move every host record to
        disk (durably), stop the threads, release the directory (also when moving fails: the error is raised
        after the release)."""
        try:
            if self.remote is not None:
                self.remote.close(drain=True)  # records on their way to the store go first
            if self.writer is not None:
                self._demote([n for n in self.host_order if n not in self.moving])
                self._settle(self.writer.drain())
        finally:
            self.abandon()

    def abandon(self) -> None:
        """What a process death does: the threads stop, the lock goes; nothing more is flushed."""
        if hasattr(self, "loader"):
            self.loader.shutdown(wait=True)
        if self.writer is not None:
            self.writer.stop()
        if self.claimed is not None:
            self.claimed.release()
        if self.remote is not None:
            self.remote.close(drain=False)

    # ------------------------------------------------------------------ store

    def where(self, name: str) -> str | None:
        """The tier holding record `name` (host first: a record moving to disk is read from the host), or None."""
        return "host" if name in self.host_order else "disk" if name in self.disk_order else None

    def locate(self, names: Sequence[str]) -> dict[str, str | None]:
        """The tier holding each of `names`: host and disk as `fetch` reads them (their orders: a record the
        writer made durable joins the disk when its batch settles), then one lookup in the remote store for
        what they lack."""
        found = {name: self.where(name) for name in names}
        missing = [name for name, tier in found.items() if tier is None]
        if self.remote is not None and missing:
            found.update(dict.fromkeys(self.remote.holds(missing), self.remote.tier))
        return found

    def put(self, kind: str, key: NDArray[np.uint64], lo: int, hi: int, payload: Buffer) -> None:
        """Store a `kind` record of block `key` over tokens [lo, hi) (one already held is only touched)."""
        src = np.frombuffer(payload, np.uint8)
        self.store(kind, key, lo, hi, len(src), lambda out: np.copyto(out, src))

    def store(self, kind: str, key: NDArray[np.uint64], lo: int, hi: int, nbytes: int,
              fill: Callable[[NDArray[np.uint8]], None], publish: bool = True) -> None:
        """Store a record whose `nbytes` of payload `fill(out)` writes straight into its place (the host arena,
        or a buffer for the disk or the remote store when it cannot fit the arena); one already held is only
        touched.  With `publish` and a remote tier, the record is also put into the shared store.  If `fill`
        raises, nothing is stored."""
        if self.writer is not None:
            self._settle(self.writer.reap())
        name = record_name(key, kind)
        if self.where(name) is not None or name in self.moving:
            self.counts["put_present"] += 1
            return
        header = self._header(kind, key, lo, hi, nbytes)
        if self._make_host_room(HEADER_BYTES + nbytes):
            payload = self.host.reserve(name, header)
            try:
                fill(payload)
            except BaseException:
                self.host.remove(name)
                raise
            self.host_order.add([name])
            self.counts["stored_host"] += 1
            if publish and self.remote is not None:
                self.remote.put(name, header, payload)
            self._demote_early()
        elif self.writer is not None or (publish and self.remote is not None):
            payload = np.empty(nbytes, np.uint8)
            fill(payload)
            if publish and self.remote is not None:
                self.remote.put(name, header, payload)
            if self.writer is not None:
                self.moving.add(name)
                self._submit([(name, header, payload)])

    def _header(self, kind: str, key: NDArray[np.uint64], lo: int, hi: int, nbytes: int) -> RecordHeader:
        """A record's header; its payload checksum is left UNSUMMED: the writer thread computes it on the way to
        disk (host records live in process memory, trusted like the device pools)."""
        return RecordHeader(layout_fingerprint=self.fingerprint, kind=kind, abi_id=self.abi_id, token_start=lo,
                            token_end=hi, keys=np.asarray(key, np.uint64).reshape(1, 2), payload_bytes=nbytes,
                            payload_checksum=UNSUMMED)

    def _make_host_room(self, nbytes: int) -> bool:
        """Move the host records first in eviction order to disk (or drop them without one) until `nbytes` fit;
        False when they cannot."""
        if nbytes > self.host.budget:
            return False
        while self.host.largest_free < nbytes:
            idle = [n for n in self.host_order if n not in self.moving]
            if self.writer is not None and self.writer.pending:
                self._settle(self.writer.reap(wait=True))  # room comes back when a batch settles
            elif idle:
                batch = idle[:max(1, len(idle) // 4)]
                self._demote(batch) if self.writer is not None else self._drop_host(batch, "dropped_host")
            else:
                return False
        return True

    def _demote_early(self) -> None:
        """Above 3/4 of the arena, start moving the first quarter in eviction order to disk in the background."""
        if self.writer is None or self.writer.pending or 4 * self.host.used_bytes <= 3 * self.host.budget:
            return
        idle = [n for n in self.host_order if n not in self.moving]
        self._demote(idle[:max(1, len(idle) // 4)])

    def _drop_host(self, names: Sequence[str], count: str) -> None:
        for name in names:
            self.host.remove(name)
            del self.host_order[name]
        self.counts[count] += len(names)

    def _demote(self, names: Sequence[str]) -> None:
        """Host records to disk in one durable batch on the writer thread; they stay readable on the host until
        it settles (`_settle`)."""
        if not names:
            return
        records: list[Record] = []
        for name in names:  # the arena extent is the record's image: written to disk with no copy
            image = self.host.image(name)
            records.append((name, self.host.header(name), image))
        self.moving.update(names)  # pinned: the extents stay until the batch settles
        self._submit(records)

    def _submit(self, records: list[Record]) -> None:
        """Hand records to the writer in batches that fit the disk budget (oldest first, so the most recent
        survive when they cannot all stay); a record larger than the budget is refused (counted)."""
        assert self.disk is not None and self.writer is not None
        self._settle(self.writer.reap())  # a finished batch is counted once: on disk, no longer pending
        batch: list[Record] = []
        for record in records:
            if record_bytes([record]) > self.disk.budget:
                self._refuse([record[0]], "dropped_too_large")
            elif record_bytes([*batch, record]) > self.disk.budget:
                self._send(batch)
                batch = [record]
            else:
                batch.append(record)
        if batch:
            self._send(batch)

    def _send(self, batch: list[Record]) -> None:
        """Delete the disk records first in eviction order until `batch` fits, then hand it to the writer."""
        assert self.disk is not None and self.writer is not None
        need = record_bytes(batch)
        victims = iter(self.disk_order)  # one snapshot of the order for every victim, until records join it
        while self.disk.budget - self.disk.used_bytes - self.writer.pending_bytes < need:
            if self.disk_order:
                victim = next(victims, None)
                if victim is None:  # the snapshot ran out: walk the order as it is now
                    victims = iter(self.disk_order)
                    continue
                if victim not in self.disk_order:  # left since the snapshot
                    continue
                try:
                    self.disk.remove(victim)
                except TierError:
                    self.counts["remove_failed"] += 1
                    break  # the writer refuses what does not fit (TierFull, counted)
                del self.disk_order[victim]
                self.counts["evicted_disk"] += 1
            elif self.writer.pending:
                self._settle(self.writer.reap(wait=True))  # what is being written becomes evictable
                victims = iter(self.disk_order)  # it joined the order: walk it again, least recent first
            else:
                break
        self.writer.submit(batch)

    def _refuse(self, names: Sequence[str], count: str) -> None:
        """Records that will not reach disk: no longer moving, their host copies dropped, counted."""
        self.moving.difference_update(names)
        on_host = [name for name in names if name in self.host_order]
        self._drop_host(on_host, count)
        self.counts[count] += len(names) - len(on_host)

    def _settle(self, batches: list[tuple[list[str], BaseException | None]]) -> None:
        """Settled batches: published records join the disk; the host copies go either way (a failed batch is
        dropped whole and counted: never half).  An injected Crash is raised here, on the caller's thread."""
        for names, error in batches:
            if error is None:
                self.disk_order.add(names)
                self.counts["stored_disk"] += len(names)
            elif isinstance(error, Crash):
                raise error
            else:
                self._refuse(names, "dropped_too_large" if isinstance(error, TierFull) else "write_failed")
                continue
            self.moving.difference_update(names)
            self._drop_host([name for name in names if name in self.host_order], "demoted")

    def drain(self) -> None:
        """Wait until every batch moving to disk has settled."""
        if self.writer is not None:
            self._settle(self.writer.drain())

    def evict(self, tier: str) -> int:
        """Every record of `tier` out: host records move to disk (dropped without one), disk records are
        deleted; returns the records evicted."""
        if tier == "host":
            held = len(self.host_order)
            names = [n for n in self.host_order if n not in self.moving]
            self._demote(names) if self.writer is not None else self._drop_host(names, "dropped_host")
            self.drain()
            return held
        assert tier == "disk" and self.disk is not None, tier
        self.drain()
        names = list(self.disk_order)
        for name in names:
            self.disk.remove(name)
        self.disk_order.clear()
        self.counts["evicted_disk"] += len(names)
        return len(names)

    # ------------------------------------------------------------------ load

    def touch(self, names: Sequence[str]) -> None:
        """Mark a prefix's records (root first) used in each tier's order: deepest first, heads end most
        recent."""
        self.host_order.touch(names)
        self.disk_order.touch(names)

    def fetch(self, wanted: Sequence[Wanted]) -> list[Loaded | None]:
        """Each wanted record's checked payload with its tier and the seconds its read took, or None (a miss: not
        held, unreadable, or failing a check - quarantined).  Disk reads run on the loader threads; what no local
        tier holds is asked of the remote store in one batch meanwhile (its payloads stay valid until the next
        fetch)."""
        jobs: list[Any] = []
        distant: list[int] = []  # wanted records no local tier holds
        for i, want in enumerate(wanted):
            tier = self.where(want.name)
            if tier == "disk":
                jobs.append(self.loader.submit(self._read_disk, want))
            else:
                jobs.append(self._read_host(want) if tier == "host" else None)
                distant += [i] if tier is None else []
        if self.remote is not None:
            for i, got in zip(distant, self.remote.fetch([wanted[i] for i in distant]), strict=True):
                jobs[i] = got
                self.counts["loaded_remote" if got is not None else "missed_remote"] += 1
        out: list[Loaded | None] = [job.result() if isinstance(job, Future) else job for job in jobs]
        for want, got in zip(wanted, out, strict=True):
            if got is not None and got[0] == "disk":
                self.counts["loaded_disk"] += 1
            elif got is None and self.where(want.name) == "disk":
                del self.disk_order[want.name]  # quarantined (kept as evidence, outside the budget) or unreadable
                assert self.disk is not None
                if want.name in self.disk.sizes:  # unreadable: deleted, or its bytes would leak from the budget
                    self.disk.remove(want.name)
                self.counts["missed_disk"] += 1
        return out

    def keep_local(self, want: Wanted, payload: Buffer) -> None:
        """A record loaded from the remote store, kept in the local tiers too (not published again)."""
        if self.host.budget or self.writer is not None:
            src = np.frombuffer(payload, np.uint8)
            self.store(want.kind, want.key, want.lo, want.hi, len(src), lambda out: np.copyto(out, src),
                       publish=False)

    def _read_host(self, want: Wanted) -> Loaded | None:
        """The host store's checked record; one that fails is dropped and counted (or, on its way to disk, left
        for the batch to free)."""
        got = self.host.fetch([want])[0]
        if got is None:
            if want.name in self.moving:  # its extent is being written to disk: freed when the batch settles
                self.counts["missed_host"] += 1
            else:
                self._drop_host([want.name], "quarantined_host")
            return None
        self.counts["loaded_host"] += 1
        return got

    def _read_disk(self, want: Wanted) -> Loaded | None:
        """On a loader thread: the disk store's checked record (quarantined when it fails), or None."""
        assert self.disk is not None
        return self.disk.fetch([want])[0]

    def report(self) -> dict[str, Any]:
        """Counts and occupancy, for results and --json (after settling the batches already written)."""
        if self.writer is not None:
            self._settle(self.writer.reap())
        out: dict[str, Any] = {"counts": dict(self.counts), "host_records": len(self.host_order),
                               "host_used_bytes": self.host.used_bytes, "host_budget_bytes": self.host.budget}
        if self.disk is not None:
            out.update(disk_records=len(self.disk_order), disk_used_bytes=self.disk.used_bytes,
                       disk_budget_bytes=self.disk.budget, disk_counts=dict(self.disk.counts),
                       faults_fired=dict(self.disk.faults.fired),
                       direct_io=self.disk.direct_io, direct_io_fallback=self.disk.fallback_reason)
        if self.remote is not None:
            out["remote"] = self.remote.report()
        return out
