"""The Store interface (hkv_tiers/store.py), the same checks against each tier that implements it: host, disk and
the remote store against a real master (its case skips, saying why, without Mooncake)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hkv_core import Layout
from hkv_core.errors import InvalidArgument, TierFull
from hkv_core.tiers.record import RecordHeader, checksum
from hkv_tiers import DiskStore, HostStore, RemoteStore, Store
from hkv_tiers.record_check import Wanted, record_name, span_abi_id
from hkv_tiers.span_io import BLOCK

LAYOUT = Layout.from_preset("tiny_v4")
FINGERPRINT, ABI = LAYOUT.fingerprint(), span_abi_id(LAYOUT.pools)
BUDGET = 64 << 10


def payload(n: int) -> bytes:
    return np.random.default_rng(n).integers(0, 256, 100 + 37 * n, np.uint8).tobytes()


def key_of(n: int) -> np.ndarray:
    return np.array([n, 23], np.uint64)


def header_of(n: int, nbytes: int = -1) -> RecordHeader:
    data = payload(n)
    return RecordHeader(layout_fingerprint=FINGERPRINT, kind=BLOCK, abi_id=ABI, token_start=8 * n,
                        token_end=8 * n + 8, keys=key_of(n).reshape(1, 2),
                        payload_bytes=len(data) if nbytes < 0 else nbytes, payload_checksum=checksum(data))


def want(n: int, shift: int = 0) -> Wanted:
    return Wanted(BLOCK, key_of(n), 8 * n + shift, 8 * n + 8 + shift, len(payload(n)))


@pytest.fixture(params=["host", "disk", "remote"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store
    if request.param == "host":
        made = HostStore(BUDGET, fingerprint=FINGERPRINT, abi_id=ABI)
    elif request.param == "disk":
        made = DiskStore(tmp_path, BUDGET, FINGERPRINT, abi_id=ABI)
    else:
        master = request.getfixturevalue("master")  # skips without Mooncake
        made = RemoteStore(master.config(deadline_s=5.0, retry_s=0.05, staging_bytes=BUDGET), fingerprint=FINGERPRINT,
                           abi_id=ABI, model_id=f"store interface {tmp_path.name}")
    yield made
    made.close()


def settle(store: Store) -> None:
    """What a put needs before it is seen: nothing on host and disk, the publishing worker on the remote store."""
    if isinstance(store, RemoteStore):
        assert store.drain(timeout_s=10.0) == 0


def test_every_tier_is_a_store(store: Store) -> None:
    assert isinstance(store, Store) and store.tier in ("host", "disk", "remote")
    assert 0 <= store.used_bytes <= store.budget


def test_a_put_record_is_held_fetched_checked_and_removed(store: Store) -> None:
    name, other = record_name(key_of(1)), record_name(key_of(2))
    store.put(name, header_of(1), payload(1))
    settle(store)
    assert store.holds([name, other]) == {name}
    [got, missing] = store.fetch([want(1), want(2)])
    assert missing is None
    assert got is not None and got[0] == store.tier and bytes(got[1]) == payload(1) and got[2] >= 0
    assert 0 <= store.used_bytes <= store.budget
    store.remove(name)
    store.remove(other)  # not held: nothing happens
    assert store.holds([name]) == set() and store.fetch([want(1)]) == [None]


def test_a_record_that_is_not_the_one_a_load_wants_is_never_returned(store: Store) -> None:
    store.put(record_name(key_of(3)), header_of(3), payload(3))
    settle(store)
    assert store.fetch([want(3, shift=8)]) == [None]  # another token range than the record holds


def test_a_record_whose_bytes_changed_is_never_returned(store: Store, tmp_path: Path) -> None:
    """The header's checksum is of other bytes: host and disk find it at the read, the remote store too."""
    wrong = bytearray(payload(4))
    wrong[0] ^= 0xFF
    store.put(record_name(key_of(4)), header_of(4), bytes(wrong))
    settle(store)
    assert store.fetch([want(4)]) == [None]


@pytest.mark.parametrize("kind", ["host", "disk"])
def test_a_local_put_that_cannot_fit_is_refused_and_changes_nothing(kind: str, tmp_path: Path) -> None:
    store: Store = (HostStore(8192, fingerprint=FINGERPRINT, abi_id=ABI) if kind == "host"
                    else DiskStore(tmp_path, 8192, FINGERPRINT, abi_id=ABI))
    big = np.zeros(3 * 4096, np.uint8).tobytes()
    before = store.used_bytes
    with pytest.raises(TierFull):
        store.put("big", header_of(5, nbytes=len(big)), big)
    assert store.used_bytes == before and store.holds(["big"]) == set()


def test_a_disk_store_without_the_abi_id_refuses_to_fetch(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="abi_id"):
        DiskStore(tmp_path, BUDGET, FINGERPRINT).fetch([want(1)])


def test_a_store_that_serves_unchecked_records_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: a host store whose fetch skips the record checks returns the record of another token
    range - what the test above refuses."""
    from hkv_tiers import host_store

    monkeypatch.setattr(host_store, "check_record", lambda *args, **kwargs: None)
    store = HostStore(BUDGET, fingerprint=FINGERPRINT, abi_id=ABI)
    store.put(record_name(key_of(3)), header_of(3), payload(3))
    assert store.fetch([want(3, shift=8)]) != [None]


def test_a_host_put_of_the_wrong_length_is_refused_and_changes_nothing() -> None:
    store = HostStore(BUDGET, fingerprint=FINGERPRINT, abi_id=ABI)
    for wrong in (payload(1)[:-1], payload(1)[:1]):  # short, or one byte numpy would broadcast
        with pytest.raises(InvalidArgument, match="the header says"):
            store.put(record_name(key_of(1)), header_of(1), wrong)
        assert store.holds([record_name(key_of(1))]) == set() and store.used_bytes == 0
