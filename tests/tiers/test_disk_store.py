"""The disk store publishes only durable records, serves only records that check, and survives restarts.

Every fault class of the store is switched on once and must be handled: the
record is refused or quarantined and counted, never served, nothing leaks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hkv_core import Layout
from hkv_core.errors import RecordCorrupt, TierError, TierFull
from hkv_core.tiers.record import HEADER_BYTES, RecordHeader, checksum, pack_header, padded, unpack_header
from hkv_tiers import Crash, DiskFaults, DiskStore

FINGERPRINT = Layout.from_preset("tiny_v4").fingerprint()
OTHER = Layout.from_preset("tiny_csa").fingerprint()


def record(payload: bytes, fingerprint: str = FINGERPRINT, keys: int = 2) -> RecordHeader:
    return RecordHeader(layout_fingerprint=fingerprint, kind="compressed_kv", abi_id="ckv/bf16/[16]/e2/v1",
                        token_start=8, token_end=24, keys=np.arange(2 * keys, dtype=np.uint64).reshape(keys, 2),
                        payload_bytes=len(payload), payload_checksum=checksum(payload))


PAYLOAD = bytes(range(256)) * 20  # 5,120 bytes: padded to 8,192


def test_header_round_trip_and_every_field_is_checked() -> None:
    header = record(PAYLOAD)
    packed = pack_header(header)
    assert len(packed) == HEADER_BYTES and unpack_header(packed) == header
    for at in (0, 9, 30, 60, 100):  # magic, version, fingerprint, texts, range: a flipped byte never passes
        broken = bytearray(packed)
        broken[at] ^= 0x01
        with pytest.raises(RecordCorrupt):
            unpack_header(bytes(broken))
    with pytest.raises(RecordCorrupt, match="truncated|bytes"):
        unpack_header(packed[:100])


def test_put_get_and_restart(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, 1 << 20, FINGERPRINT)
    store.put("p0", record(PAYLOAD), PAYLOAD)
    assert (tmp_path / "p0.rec").stat().st_size == HEADER_BYTES + padded(len(PAYLOAD)) == store.used_bytes
    header, payload = store.get("p0")
    assert payload == PAYLOAD and header == record(PAYLOAD)
    reopened = DiskStore(tmp_path, 1 << 20, FINGERPRINT)  # a restart: rebuilt from the headers
    assert list(reopened.scan()) == ["p0"] and reopened.get("p0")[1] == PAYLOAD
    assert store.direct_io or store.fallback_reason  # O_DIRECT, or the reason it was not used


def test_budget(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, HEADER_BYTES + padded(len(PAYLOAD)), FINGERPRINT)
    store.put("p0", record(PAYLOAD), PAYLOAD)
    with pytest.raises(TierFull) as info:
        store.put("p1", record(PAYLOAD), PAYLOAD)
    assert info.value.needed == 12288 and info.value.free == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p0.rec"]


@pytest.mark.parametrize("fault", ["eio_write", "enospc_write"])
def test_write_errors_publish_nothing(tmp_path: Path, fault: str) -> None:
    store = DiskStore(tmp_path, 1 << 20, FINGERPRINT, faults=DiskFaults(**{fault: 1}))
    with pytest.raises(TierError) as info:
        store.put("p0", record(PAYLOAD), PAYLOAD)
    assert info.value.errno is not None and list(tmp_path.iterdir()) == [] and store.used_bytes == 0
    store.put("p0", record(PAYLOAD), PAYLOAD)  # the fault passed: the next write works
    assert store.get("p0")[1] == PAYLOAD and sum(store.counts[k] for k in store.counts if k.startswith("write_")) == 1


@pytest.mark.parametrize("fault", ["torn_write", "flip_byte"])
def test_damaged_records_are_quarantined_never_served(tmp_path: Path, fault: str) -> None:
    store = DiskStore(tmp_path, 1 << 20, FINGERPRINT, faults=DiskFaults(**{fault: 1}))
    store.put("p0", record(PAYLOAD), PAYLOAD)
    with pytest.raises(RecordCorrupt):
        store.get("p0")
    assert store.counts["quarantined"] == 1 and (tmp_path / "p0.bad").exists() and store.used_bytes == 0
    with pytest.raises(TierError):
        store.get("p0")  # gone from the store: never served later either


def test_a_crash_before_the_rename_leaves_no_record(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, 1 << 20, FINGERPRINT, faults=DiskFaults(crash_before_rename=1))
    with pytest.raises(Crash):
        store.put("p0", record(PAYLOAD), PAYLOAD)
    assert (tmp_path / "p0.tmp").exists()  # what a dead process leaves
    reopened = DiskStore(tmp_path, 1 << 20, FINGERPRINT)
    assert reopened.scan() == {} and reopened.counts["temp_removed"] == 1 and list(tmp_path.iterdir()) == []


def test_read_errors_and_other_layouts(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, 1 << 20, FINGERPRINT, faults=DiskFaults(eio_read=1))
    store.put("p0", record(PAYLOAD), PAYLOAD)
    with pytest.raises(TierError, match="read failed"):
        store.get("p0")
    assert store.get("p0")[1] == PAYLOAD  # a transient read error quarantines nothing
    other = DiskStore(tmp_path / "x", 1 << 20, OTHER)
    other.put("q0", record(PAYLOAD, OTHER), PAYLOAD)
    (tmp_path / "x" / "q0.rec").rename(tmp_path / "q0.rec")  # another layout's record in this directory
    reopened = DiskStore(tmp_path, 1 << 20, FINGERPRINT)
    assert list(reopened.scan()) == ["p0"] and reopened.counts["quarantined"] >= 1


def test_a_failed_directory_fsync_unpublishes_the_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = DiskStore(tmp_path, 1 << 20, FINGERPRINT)

    def refuse() -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(store, "_fsync_directory", refuse)
    with pytest.raises(TierError, match="write failed"):
        store.put_many([("p0", record(PAYLOAD), PAYLOAD), ("p1", record(PAYLOAD), PAYLOAD)])
    assert list(tmp_path.iterdir()) == [] and store.used_bytes == 0
