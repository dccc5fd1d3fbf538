"""The remote tier: records shared through a Mooncake Store, served only after they check.

Records are the disk tier's (hkv_core.tiers.record: the header with layout fingerprint, kind, ABI id, token
range, block key and payload checksum, then the payload; without the disk's alignment padding, which only
direct I/O needs).  A record's key in the store is `<namespace>/<model digest>/<record name>`: the record name
is its block key (seeded with the shared key seed, salted per tenant, namespaced by the layout), the model
digest keeps instances with other weights apart.

- `publish` copies a record into the staging arena (registered with the client once, so `put_from` sends it
  with no further copy) and puts it on a worker thread, after the payload checksum is computed there; the
  first instance to publish a key wins (the store keeps it; a second put is a no-op).
- `locate` asks which records the store holds (one `batch_is_exist`), `fetch` gets the wanted ones
  (one `batch_get_into` into staging slots) - each within `deadline_s`, else a miss.  Every record fetched is
  checked (length, header, layout, kind, ABI id, range, key, checksum); one that fails is removed from the
  store, remembered as bad (not located or fetched again by this instance until it publishes that record
  itself) and counted.
- A failed or late operation marks the tier unavailable for `retry_s`: meanwhile it is not asked (serving goes
  on from the local tiers or by recomputing); after it, the next operation tries again, so the tier comes back
  by itself when the master does (the Mooncake client reconnects).
- A fetch's payloads are views into staging slots, valid until the next `fetch` (or `close`).
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from typing import Any, TypeVar

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.errors import RecordCorrupt, TierError, TierFull
from hkv_core.tiers.record import HEADER_BYTES, UNSUMMED, RecordHeader, checksum, pack_header, unpack_header
from hkv_tiers.host_arena import HostArena
from hkv_tiers.mooncake_client import connect
from hkv_tiers.record_check import Buffer, Loaded, Wanted, check_record
from hkv_tiers.remote_config import RemoteFaults, RemoteTierConfig

TIER = "remote"
NOT_FOUND = -704  # Mooncake: no such object (never stored, evicted, or removed)
TOO_SMALL = -600  # Mooncake: the object does not fit the buffer (longer than the layout's record)
FOREIGN_FINGERPRINT = "f" * 32  # the foreign_layout fault's: no layout has it
Slot = tuple[str, NDArray[np.uint8]]  # a staging slot: its name in the arena, its bytes
T = TypeVar("T")


class RemoteStore:
    """One instance's view of a shared Mooncake Store (see the module docstring): a Store (store.py) whose
    `put` publishes on a worker, `holds` locates and `budget` is the staging arena's.  With `client` (a Mooncake
    client already set up, e.g. shared by several stores in one process) no connection is made and `close`
    leaves that client open; otherwise the store connects (`mooncake_client.connect`) and closes its own."""

    tier = TIER

    def __init__(self, config: RemoteTierConfig, *, fingerprint: str, abi_id: str, model_id: str,
                 client: Any = None) -> None:
        self.config, self.fingerprint, self.abi_id = config, fingerprint, abi_id
        self.prefix = f"{config.namespace}/{hashlib.blake2b(model_id.encode(), digest_size=8).hexdigest()}/"
        self.faults = config.faults if config.faults is not None else RemoteFaults()
        self.counts: Counter[str] = Counter()
        self.problems: Counter[str] = Counter()  # why records were dropped
        self.lock = threading.Lock()  # counts, staging, availability: workers report on their threads
        try:  # before connecting: a failed allocation leaves no client
            self.staging = HostArena(config.staging_bytes)
        except (MemoryError, ValueError, OverflowError, OSError) as err:
            raise TierError(tier=TIER, record="staging", reason=f"cannot preallocate {config.staging_bytes:,} "
                            f"bytes ({type(err).__name__})") from None
        self.owns_client = client is None
        self.client = client if client is not None else connect(config)
        base = self.staging.arena.ctypes.data
        try:
            self.registered = bool(config.zero_copy) and self.client.register_buffer(base, self.staging.budget) == 0
        except BaseException:
            if self.owns_client:
                self.client.close()
            raise
        self._slot_ids = itertools.count()
        self.pool = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="hkv-remote")
        self.publishing: deque[Future[None]] = deque()
        self.down_until, self.last_error = 0.0, ""
        self.bad: set[str] = set()  # records that failed a check: never located or served again
        self.held: list[str] = []  # staging slots holding the last fetch's payloads
        self.closed = False

    # ------------------------------------------------------------------ state

    @property
    def budget(self) -> int:
        return self.staging.budget

    @property
    def used_bytes(self) -> int:
        with self.lock:
            return self.staging.used_bytes

    def key(self, name: str) -> str:
        """Record `name`'s key in the store: `<namespace>/<model digest>/<name>`."""
        return self.prefix + name

    @property
    def available(self) -> bool:
        """Not within `retry_s` of a failure (the next operation after it probes the master again)."""
        return time.monotonic() >= self.down_until

    def _count(self, name: str, n: int = 1) -> None:
        if n:
            with self.lock:
                self.counts[name] += n

    def _down(self, reason: str) -> None:
        with self.lock:
            self.down_until = time.monotonic() + self.config.retry_s
            self.last_error = reason
            self.counts["unavailable"] += 1

    def _slot(self, nbytes: int) -> Slot | None:
        with self.lock:
            name = f"s{next(self._slot_ids)}"
            try:
                return name, self.staging.reserve(name, nbytes)
            except TierFull:
                return None

    def _free(self, slots: Sequence[str]) -> None:
        with self.lock:
            for name in slots:
                self.staging.drop(name)

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        """`fn(*args)` on a worker within the deadline; None (the tier marked unavailable) when it fails or is
        late."""
        future = self.pool.submit(fn, *args)
        try:
            return future.result(timeout=self.config.deadline_s)
        except FutureTimeout:
            future.cancel()  # still queued behind a stuck call: never run it (the queue would grow while it hangs)
            self._count(f"{what}_timeout")
            self._down(f"{what} past the {self.config.deadline_s} s deadline")
        except Exception as err:  # the client raised: whatever it was, the tier is not usable now
            self._count(f"{what}_error")
            self._down(f"{what} raised {type(err).__name__}: {err}")
        return None

    # ------------------------------------------------------------------ publish

    def publish(self, name: str, header: RecordHeader, payload: Buffer) -> None:
        """Put record `name` (its header and `payload`) into the store on a worker; skipped (counted) while
        the tier is unavailable or the staging arena is full of records still on their way."""
        self._reap()
        if not self.available:
            self._count("publish_skipped")
            return
        src = np.frombuffer(payload, np.uint8)
        slot = self._slot(HEADER_BYTES + len(src))
        if slot is None and self.publishing:
            wait_futures(list(self.publishing), timeout=self.config.deadline_s)
            self._reap()
            slot = self._slot(HEADER_BYTES + len(src))
        if slot is None:
            self._count("publish_skipped_full")
            if any(not put.done() for put in self.publishing):  # puts still on their way after a deadline are
                self._down(f"puts past the {self.config.deadline_s} s deadline")  # late: skip, not wait, for retry_s
            return
        slot[1][HEADER_BYTES:] = src
        self.bad.discard(name)  # recomputed here: what this instance puts under the name is good
        self.publishing.append(self.pool.submit(self._put, name, header, slot))

    def put(self, name: str, header: RecordHeader, payload: Buffer) -> None:
        """`publish` (the Store interface's name for it)."""
        self.publish(name, header, payload)

    def _put(self, name: str, header: RecordHeader, slot: Slot) -> None:
        """On a worker: checksum the payload, pack the header in front of it, put it (faults applied)."""
        image = slot[1]
        try:
            if header.payload_checksum == UNSUMMED:
                header = attrs.evolve(header, payload_checksum=checksum(image[HEADER_BYTES:]))
            if self.faults.take("foreign_layout"):
                header = attrs.evolve(header, layout_fingerprint=FOREIGN_FINGERPRINT)
            image[:HEADER_BYTES] = np.frombuffer(pack_header(header), np.uint8)
            length = self._damage(image, header.payload_bytes)
            key = self.key(name)
            rc = (self.client.put_from(key, image.ctypes.data, length) if self.registered
                  else self.client.put(key, image[:length].tobytes()))
            if rc < 0:
                self._count(f"put_error_{rc}")
                self._down(f"put returned {rc}")
            else:
                self._count("published")
        except Exception as err:
            self._count("put_error")
            self._down(f"put raised {type(err).__name__}: {err}")
        finally:
            self._free([slot[0]])

    def _damage(self, image: NDArray[np.uint8], payload_bytes: int) -> int:
        """The flipped-byte and truncation faults (after the checksum: the bytes are wrong, the header is not);
        the bytes to put."""
        if self.faults.take("truncate"):
            return HEADER_BYTES + payload_bytes // 2
        if self.faults.take("flip_byte") and payload_bytes:
            image[HEADER_BYTES + self.faults.fired["flip_byte"] % payload_bytes] ^= 0xFF
        return len(image)

    def _reap(self) -> None:
        while self.publishing and self.publishing[0].done():
            self.publishing.popleft()

    def drain(self, timeout_s: float | None = None) -> int:
        """Wait for the records on their way (at most `timeout_s`); how many are still on their way."""
        if self.publishing:
            wait_futures(list(self.publishing), timeout=timeout_s)
        self._reap()
        return len(self.publishing)

    # ------------------------------------------------------------------ read

    def locate(self, names: Sequence[str]) -> set[str]:
        """Which of `names` the store holds (one lookup within the deadline; nothing while unavailable)."""
        names = [name for name in names if name not in self.bad]
        if not names or not self.available:
            return set()
        codes = self._call("lookup", self.client.batch_is_exist, [self.key(name) for name in names])
        if codes is None:
            return set()
        if any(code < 0 for code in codes):
            self._down(f"lookup returned {min(codes)}")
            return set()
        self._count("lookups")
        return {name for name, code in zip(names, codes, strict=True) if code == 1}

    def holds(self, names: Sequence[str]) -> set[str]:
        """`locate` (the Store interface's name for it)."""
        return self.locate(names)

    def fetch(self, wanted: Sequence[Wanted]) -> list[Loaded | None]:
        """Each wanted record's checked payload (a view valid until the next fetch) with the seconds its share of
        the batch took, or None: not held, late, failing a check (then removed from the store and counted), found
        bad before, or without a room of its size in the staging arena (`fetch_no_room`; a record the load does
        not size, `nbytes` -1, is never fetched: its slot is sized to the layout's record)."""
        self.release()
        out: list[Loaded | None] = [None] * len(wanted)
        if not wanted or not self.available:
            self._count("fetch_skipped", len(wanted))
            return out
        slots = [self._slot(HEADER_BYTES + want.nbytes) if want.nbytes >= 0 and want.name not in self.bad else None
                 for want in wanted]
        asked = [(i, slot) for i, slot in enumerate(slots) if slot is not None]
        known_bad = sum(want.name in self.bad for want in wanted)
        self._count("fetch_known_bad", known_bad)
        self._count("fetch_no_room", len(wanted) - len(asked) - known_bad)
        if not asked:
            return out
        began = time.perf_counter()
        future = self.pool.submit(self._get_batch, [self.key(wanted[i].name) for i, _ in asked],
                                  [slot for _, slot in asked])
        try:
            codes = future.result(timeout=self.config.deadline_s)
        except FutureTimeout:  # its slots are freed once the late get is done with them (at once if it never ran)
            future.cancel()
            future.add_done_callback(lambda _: self._free([slot[0] for _, slot in asked]))
            self._count("get_timeout", len(asked))
            self._down(f"get past the {self.config.deadline_s} s deadline")
            return out
        except Exception as err:
            self._free([slot[0] for _, slot in asked])
            self._down(f"get raised {type(err).__name__}: {err}")
            return out
        seconds = time.perf_counter() - began
        total = max(1, sum(max(code, 0) for code in codes))
        for (i, slot), code in zip(asked, codes, strict=True):
            payload = self._checked(wanted[i], slot, code)
            if payload is None:
                self._free([slot[0]])
                continue
            self.held.append(slot[0])
            out[i] = (TIER, payload, seconds * code / total)
        return out

    def _get_batch(self, keys: list[str], slots: list[Slot]) -> list[int]:
        """On a worker: the records into their slots; per key the bytes read or Mooncake's error code."""
        if self.faults.take("slow_get"):
            time.sleep(self.faults.slow_seconds)
        if self.registered:
            return list(self.client.batch_get_into(keys, [s[1].ctypes.data for s in slots], [len(s[1]) for s in slots]))
        codes = []
        for key, (_, buffer) in zip(keys, slots, strict=True):
            data = self.client.get(key)
            if not data:
                codes.append(NOT_FOUND)
            elif len(data) > len(buffer):
                codes.append(TOO_SMALL)
            else:
                buffer[:len(data)] = np.frombuffer(data, np.uint8)
                codes.append(len(data))
        return codes

    def _checked(self, want: Wanted, slot: Slot, code: int) -> NDArray[np.uint8] | None:
        """The payload of a fetched record that checks, else None (dropped when it was there and bad)."""
        if code == NOT_FOUND:
            self._count("missing")
            return None
        if code < 0 and code != TOO_SMALL:
            self._count(f"get_error_{code}")
            self._down(f"get returned {code}")
            return None
        image = slot[1]
        try:
            if code == TOO_SMALL:
                raise RecordCorrupt(tier=TIER, record=want.name, reason="longer than the layout's record")
            if code != len(image):
                raise RecordCorrupt(tier=TIER, record=want.name,
                                    reason=f"truncated: {code:,} bytes, not {len(image):,}")
            header = unpack_header(image[:HEADER_BYTES].tobytes(), want.name, tier=TIER)
            payload = image[HEADER_BYTES:HEADER_BYTES + header.payload_bytes]
            check_record(TIER, header, payload, want, fingerprint=self.fingerprint, abi_id=self.abi_id)
        except RecordCorrupt as err:
            self._drop(want.name, err.reason)
            return None
        self._count("loaded")
        return payload

    def _drop(self, name: str, reason: str) -> None:
        """A bad record: never served or located again here, removed from the store (on a worker), counted."""
        self.bad.add(name)
        with self.lock:
            self.counts["dropped_bad"] += 1
            self.problems[reason.split(":")[0]] += 1
        self.pool.submit(self._remove, name)

    def remove(self, name: str) -> None:
        """Delete record `name` from the shared store (within the deadline; nothing while unavailable)."""
        if self.available:
            self._call("remove", self._remove, name)

    def _remove(self, name: str) -> None:
        rc = self.client.remove(self.key(name), True)
        self._count("removed" if rc == 0 else f"remove_error_{rc}")

    def release(self) -> None:
        """Free the staging slots of the last fetch's payloads."""
        held, self.held = self.held, []
        self._free(held)

    # ------------------------------------------------------------------ end

    def close(self, drain: bool = True) -> None:
        """With `drain`, wait (at most a few deadlines) for records on their way; stop the workers, unregister the
        staging arena and close the client if it is the store's own (the store forgets the records this
        instance's segment held).  The client's own close takes about 2 s, and with the master gone
        about 11 s (killed) to 35 s (not answering); it holds the GIL meanwhile, so it cannot be left to a
        thread."""
        if self.closed:
            return
        self.closed = True
        if drain:
            self.drain(timeout_s=4 * self.config.deadline_s)
        self.release()
        self.pool.shutdown(wait=True, cancel_futures=True)
        if self.registered and self.available:  # (while the master is gone it would only wait and fail)
            self.client.unregister_buffer(self.staging.arena.ctypes.data)
        if self.owns_client:  # about 2 s with a master; with one gone, tens of seconds (Mooncake's own waits)
            self.client.close()

    def report(self) -> dict[str, Any]:
        """Counts, why records were dropped, availability and staging use (for results and --json)."""
        with self.lock:
            return {"counts": dict(self.counts), "dropped_because": dict(self.problems),
                    "available": self.available, "last_error": self.last_error, "zero_copy": self.registered,
                    "staging_used_bytes": self.staging.used_bytes, "staging_budget_bytes": self.staging.budget,
                    "faults_fired": dict(self.faults.fired)}

