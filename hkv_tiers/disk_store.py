"""A crash-safe directory of records (hkv_core.tiers.record) under a byte budget.

`put(name, header, payload)` publishes a record only once it is durable: the
header and the payload (padded to 4,096 bytes) are written to `name.tmp`,
fsynced, renamed to `name.rec`, and the directory is fsynced; `put_many`
publishes a batch all or none with one directory fsync.  Writes use
O_DIRECT where the platform and file system allow it; otherwise the buffered
fallback is used and reported (`direct_io`, `fallback_reason`), never silent.
`get(name)` returns the payload only if the header and the payload check
(and the layout matches); otherwise the record is quarantined (renamed to
`name.bad`), counted, and RecordCorrupt raised.  `scan()` rebuilds what the
directory holds after a restart: every `.rec` whose header checks and whose
layout matches, leftover `.tmp` files (a crash before the rename) removed,
the rest quarantined; each counted in `counts`.

`faults` (a `DiskFaults`) switches on injected faults for tests: EIO and
ENOSPC on write, EIO on read, a torn write, a flipped byte, slow I/O, a crash
between the write and the rename.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.errors import InvalidArgument, RecordCorrupt, TierError, TierFull
from hkv_core.tiers.record import ALIGN_BYTES, HEADER_BYTES, RecordHeader, checksum, pack_header, unpack_header
from hkv_tiers.fault_switch import take_fault
from hkv_tiers.record_check import Buffer, Loaded, Wanted, check_record

TIER = "disk"
RECORD_SUFFIX, TEMP_SUFFIX, BAD_SUFFIX = ".rec", ".tmp", ".bad"


class Crash(Exception):
    """Injected: the process died between the write and the rename (tests catch it, then reopen)."""


@attrs.define
class DiskFaults:
    """Injected faults, each firing on the next `count` operations of its kind (seeded where random)."""

    eio_write: int = 0
    enospc_write: int = 0
    eio_read: int = 0
    torn_write: int = 0  # only the first half of the record reaches the file
    flip_byte: int = 0  # one payload byte is altered after it was written
    crash_before_rename: int = 0
    slow_io: int = 0  # the next reads or writes each wait `slow_seconds` first
    slow_seconds: float = 0.01
    seed: int = 0
    fired: Counter[str] = attrs.field(factory=Counter)  # faults injected so far, by switch

    def take(self, name: str) -> bool:
        """Whether fault `name` fires now (then one fewer is left, and it is counted in `fired`)."""
        return take_fault(self, name, self.fired)

    def delay(self) -> None:
        """The slow-I/O fault: wait before the operation."""
        if self.take("slow_io"):
            time.sleep(self.slow_seconds)

    @property
    def damaging(self) -> bool:
        """A fault that alters the written bytes is armed (they are then written from a copy)."""
        return bool(self.torn_write or self.flip_byte)

    @property
    def armed(self) -> dict[str, int]:
        """The switches still set, by name."""
        return {f.name: getattr(self, f.name) for f in attrs.fields(DiskFaults)
                if f.name not in ("seed", "slow_seconds", "fired") and getattr(self, f.name)}



class DiskStore:
    """Records of one layout in one directory, within `budget_bytes` (header and padding included): a Store
    (store.py) whose `fetch` checks records against the span ABI id `abi_id` (a store built without one reads
    with `get` only)."""

    tier = TIER

    def __init__(self, directory: str | Path, budget_bytes: int, layout_fingerprint: str, *,
                 direct: bool = True, faults: DiskFaults | None = None, abi_id: str | None = None) -> None:
        self.abi_id = abi_id
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.budget, self.fingerprint = int(budget_bytes), layout_fingerprint
        self.faults = faults or DiskFaults()
        self.counts: Counter[str] = Counter()
        self.direct_io, self.fallback_reason = direct and hasattr(os, "O_DIRECT"), "" if direct else "not asked"
        if direct and not hasattr(os, "O_DIRECT"):
            self.fallback_reason = "this platform has no O_DIRECT"
        self.sizes: dict[str, int] = {}
        self.lock = threading.Lock()  # counts and sizes: reads run on worker threads
        self._scratch_lock = threading.Lock()
        self._scratch = np.zeros(0, np.uint8)  # an aligned buffer for records that are not an aligned image
        self._header_buffer = np.frombuffer(mmap.mmap(-1, HEADER_BYTES), np.uint8)  # page aligned
        self.scan()

    @property
    def used_bytes(self) -> int:
        with self.lock:
            return sum(self.sizes.values())

    # ------------------------------------------------------------------ write

    def put(self, name: str, header: RecordHeader, payload: Buffer) -> None:
        """Publish record `name` durably (`put_many` of one)."""
        self.put_many([(name, header, payload)])

    def put_many(self, records: Sequence[tuple[str, RecordHeader, Buffer]]) -> None:
        """Publish records durably, all or none; each record's data is its payload (checksummed in the header)
        or its whole image (the packed header, the payload, zeros to 4,096: written with no copy when page
        aligned).  Each is written and fsynced under its temporary name, then
        all are renamed and the directory fsynced once.  TierFull over the budget, TierError on an I/O error
        (the temporary files are removed: nothing is published)."""
        free = self.budget - self.used_bytes
        sizes = []
        for name, header, data in records:
            sizes.append(header.record_bytes)
            assert len(data) in (header.payload_bytes, sizes[-1]), (name, len(data))
            free += self.sizes.get(name, 0)
            if sizes[-1] > free:
                raise TierFull(tier=TIER, record=name, needed=sizes[-1], free=free, budget=self.budget)
            free -= sizes[-1]
        written: list[Path] = []
        renamed: list[str] = []
        try:
            for name, header, payload in records:
                written.append(self._path(name, TEMP_SUFFIX))
                self._write(written[-1], header, payload)
            if self.faults.take("crash_before_rename"):
                raise Crash(records[0][0])
            for temp, (name, _, _) in zip(written, records, strict=True):
                os.replace(temp, self._path(name, RECORD_SUFFIX))
                renamed.append(name)
            self._fsync_directory()
        except OSError as err:
            for temp in written:
                temp.unlink(missing_ok=True)
            with self.lock:
                for name in renamed:  # not known durable (the directory fsync failed): unpublished again
                    self._path(name, RECORD_SUFFIX).unlink(missing_ok=True)
                    self.sizes.pop(name, None)
                self.counts[f"write_{errno.errorcode.get(err.errno or 0, 'error')}"] += 1
            raise TierError(tier=TIER, record=records[len(written) - 1][0], reason=f"write failed: {err.strerror}",
                            errno=err.errno) from None
        with self.lock:  # a writer thread may publish while readers quarantine
            for (name, _, _), size in zip(records, sizes, strict=True):
                self.sizes[name] = size
            self.counts["written"] += len(records)

    def _write(self, path: Path, header: RecordHeader, data: Buffer) -> None:
        """One record written (O_DIRECT where allowed) and fsynced.  When `data` is the record's page-aligned image
        (its header bytes are ignored: `header` is packed instead), the payload goes to disk straight from it;
        otherwise, or when an armed fault is to damage the bytes (the caller's copy stays intact), the record is
        built in a reused aligned scratch buffer."""
        self.faults.delay()
        if self.faults.take("eio_write"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        if self.faults.take("enospc_write"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        size, packed = header.record_bytes, pack_header(header)
        image = np.frombuffer(data, np.uint8)
        is_image = len(image) == size
        with self._scratch_lock:
            if is_image and image.ctypes.data % ALIGN_BYTES == 0 and not self.faults.damaging:
                self._header_buffer[:] = np.frombuffer(packed, np.uint8)
                self._write_file(path, [self._header_buffer, image[HEADER_BYTES:]], size)
                return
            if len(self._scratch) < size:
                self._scratch = np.frombuffer(mmap.mmap(-1, size), np.uint8)  # page aligned
            buffer = self._scratch[:size]
            payload = image[HEADER_BYTES:HEADER_BYTES + header.payload_bytes] if is_image else image
            buffer[:HEADER_BYTES] = np.frombuffer(packed, np.uint8)
            buffer[HEADER_BYTES:HEADER_BYTES + len(payload)] = payload
            buffer[HEADER_BYTES + len(payload):] = 0
            self._write_file(path, [buffer], self._damage(buffer, header.payload_bytes))

    def _write_file(self, path: Path, parts: list[NDArray[np.uint8]], length: int) -> None:
        """`parts` back to back, cut at `length` (a torn write), fsynced: O_DIRECT where allowed."""
        if not (self.direct_io and self._write_direct(path, parts, length)):
            with open(path, "wb") as f:
                left = length
                for part in parts:
                    f.write(part.data[:left])
                    left -= min(left, len(part))
                f.flush()
                os.fsync(f.fileno())

    def _damage(self, buffer: NDArray[np.uint8], payload_bytes: int) -> int:
        """Apply the torn-write and flipped-byte faults to `buffer`; the bytes that reach the file."""
        if self.faults.take("torn_write"):
            return len(buffer) // 2
        if self.faults.take("flip_byte") and payload_bytes:
            rng = np.random.default_rng([self.faults.seed, self.faults.fired["flip_byte"]])  # a new byte each time
            at = HEADER_BYTES + int(rng.integers(payload_bytes))
            buffer[at] ^= 0xFF
        return len(buffer)

    def _write_direct(self, path: Path, parts: list[NDArray[np.uint8]], length: int) -> bool:
        """O_DIRECT from aligned buffers (one vectored write); False (and the reason kept) when the file system
        refuses it."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        except OSError as err:
            self.direct_io, self.fallback_reason = False, f"O_DIRECT refused: {err.strerror}"
            return False
        try:
            total = sum(len(part) for part in parts)
            try:
                written = os.pwritev(fd, [part.data for part in parts], 0)
            except OSError as err:
                if err.errno != errno.EINVAL:
                    raise
                self.direct_io, self.fallback_reason = False, f"O_DIRECT write refused: {err.strerror}"
                return False  # the caller writes the file again, buffered
            if written != total:
                raise OSError(errno.EIO, "short write")
            if length < total:
                os.ftruncate(fd, length)
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def _fsync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ read

    def get(self, name: str) -> tuple[RecordHeader, memoryview]:
        """Header and payload (a read-only view, no copy) of record `name`; RecordCorrupt (quarantined) when it
        does not check, TierError when it is missing or the read fails."""
        path = self._path(name, RECORD_SUFFIX)
        try:
            self.faults.delay()
            if self.faults.take("eio_read"):
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            data = path.read_bytes()
        except OSError as err:
            with self.lock:
                self.counts["read_error"] += 1
            raise TierError(tier=TIER, record=name, reason=f"read failed: {err.strerror}", errno=err.errno) from None
        try:
            header = self._checked_header(data, name)
            payload = memoryview(data)[HEADER_BYTES:HEADER_BYTES + header.payload_bytes]
            if len(payload) != header.payload_bytes or checksum(payload) != header.payload_checksum:
                raise RecordCorrupt(tier=TIER, record=name, reason="payload checksum mismatch (torn or altered)")
        except RecordCorrupt:
            self.quarantine(name)
            raise
        with self.lock:
            self.counts["read"] += 1
        return header, payload

    def holds(self, names: Sequence[str]) -> set[str]:
        with self.lock:
            return {name for name in names if name in self.sizes}

    def fetch(self, wanted: Sequence[Wanted]) -> list[Loaded | None]:
        """Each wanted record's checked payload (`get`, then the load's own checks: record_check), or None:
        not held, unreadable, or failing a check (quarantined)."""
        if self.abi_id is None:
            raise InvalidArgument(action="DiskStore.fetch", argument="abi_id", value=None,
                                  reason="the store was built without the span ABI id its records must carry")
        return [self._read(want) for want in wanted]

    def _read(self, want: Wanted) -> Loaded | None:
        assert self.abi_id is not None
        began, name = time.perf_counter(), want.name
        try:
            header, view = self.get(name)  # quarantines what fails the record's own checks
        except TierError:  # RecordCorrupt included, and a record not held
            return None
        try:
            check_record(TIER, header, view, want, fingerprint=self.fingerprint, abi_id=self.abi_id,
                         checked=True)  # get checked the payload
        except RecordCorrupt:
            self.quarantine(name)
            return None
        return TIER, view, time.perf_counter() - began

    def close(self) -> None:
        """Nothing to let go: every record is durable once put (the directory's lock is cache_dir.py's)."""

    def _checked_header(self, data: bytes, name: str) -> RecordHeader:
        header = unpack_header(data[:HEADER_BYTES], name)
        if header.layout_fingerprint != self.fingerprint:
            raise RecordCorrupt(tier=TIER, record=name, reason="a record of another layout")
        return header

    def quarantine(self, name: str) -> None:
        with self.lock:
            self._set_aside(self._path(name, RECORD_SUFFIX), self._path(name, BAD_SUFFIX))
            self.sizes.pop(name, None)

    def _set_aside(self, path: Path, target: Path) -> None:
        """Rename whatever `path` is (a file, a directory, a link, broken or not) to `target`, or to a free
        name beside it; counted.  Never served either way: a rename that fails is counted, and the next scan
        sets it aside again."""
        try:
            if os.path.lexists(path):
                base, n = target.name[:-len(BAD_SUFFIX)], 0
                while os.path.lexists(target):
                    n += 1
                    target = target.with_name(f"{base}.{n}{BAD_SUFFIX}")
                os.replace(path, target)
        except OSError:
            self.counts["quarantine_error"] += 1
        self.counts["quarantined"] += 1

    def remove(self, name: str) -> None:
        """Delete record `name` (eviction); the directory is not fsynced: a record that comes back after a crash
        is still a whole, checked record.  TierError (the record kept, counted) when the file cannot go."""
        with self.lock:
            try:
                self._path(name, RECORD_SUFFIX).unlink(missing_ok=True)
            except OSError as err:
                self.counts["remove_error"] += 1
                raise TierError(tier=TIER, record=name, reason=f"cannot delete: {err.strerror}",
                                errno=err.errno) from None
            self.sizes.pop(name, None)
            self.counts["removed"] += 1

    def names_by_age(self) -> list[str]:
        """The records held, least recently written first (a restart's starting LRU order)."""
        def written(name: str) -> int:
            try:
                return self._path(name, RECORD_SUFFIX).stat().st_mtime_ns
            except OSError:
                return 0
        with self.lock:
            names = list(self.sizes)
        return sorted(names, key=lambda name: (written(name), name))

    # ------------------------------------------------------------------ restart

    def scan(self) -> dict[str, RecordHeader]:
        """Every record of this layout the directory holds (headers checked; payloads are checked on `get`);
        leftover temporary files removed, records that do not check quarantined."""
        found: dict[str, RecordHeader] = {}
        self.sizes.clear()
        for temp in sorted(self.directory.glob(f"*{TEMP_SUFFIX}")):
            if temp.is_symlink() or not temp.is_file():  # a directory or a link named like a temporary file
                self._set_aside(temp, temp.with_name(temp.name + BAD_SUFFIX))
                continue
            temp.unlink()
            self.counts["temp_removed"] += 1
        for path in sorted(self.directory.glob(f"*{RECORD_SUFFIX}")):
            name = path.name[:-len(RECORD_SUFFIX)]
            if not name or name.startswith(".") or path.is_symlink() or not path.is_file():
                self._set_aside(path, path.with_name(path.name + BAD_SUFFIX))  # a directory, a link, a bare ".rec"
                continue
            try:
                with open(path, "rb") as f:
                    found[name] = self._checked_header(f.read(HEADER_BYTES), name)
                self.sizes[name] = path.stat().st_size
            except (RecordCorrupt, OSError):  # unreadable, or not a record of this layout
                found.pop(name, None)
                self.quarantine(name)
        return found

    def _path(self, name: str, suffix: str) -> Path:
        assert name and "/" not in name and not name.startswith("."), name
        return self.directory / f"{name}{suffix}"
