"""A state machine over the TierCache: puts, fetches, evictions, faults, crashes and restarts.

Every record's payload is a function of its name, so whatever the cache does -
move records host -> disk on its writer thread, lose a batch to an injected
fault, quarantine a damaged record, restart from the directory - a fetch returns
exactly that payload or nothing.  Budgets always hold, nothing is left moving
after a drain, and a clean close keeps every record across the restart.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from hkv_core import Layout
from hkv_tiers import DiskFaults, TierCache, disk_store, disk_writer, record_check
from hkv_tiers.record_check import Wanted, record_name
from hkv_tiers.span_io import KINDS

LAYOUT = Layout.from_preset("tiny_v4")
FAULTS = ("eio_write", "enospc_write", "eio_read", "torn_write", "flip_byte")
RECORD_BYTES = 8192  # a record's 4,096-byte header and one page of payload (every payload here fits one)
DISK_RECORDS = 10  # the disk budget, in records
KEYS = 8  # block keys the machine uses (two record kinds each)


def payload(key: int, kind: str) -> bytes:
    """The only bytes a record of this name may ever hold."""
    return np.random.default_rng([key, KINDS.index(kind)]).integers(0, 256, 100 + key * 37 % 3000, np.uint8).tobytes()


def key_of(key: int) -> np.ndarray:
    return np.array([key, 7], np.uint64)


class TierCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="hkv-tiers-"))
        self.faults = DiskFaults(seed=1)
        self.cache = self._open()

    host_records, disk_records = 4, DISK_RECORDS

    def _open(self) -> TierCache:
        return TierCache(pools=LAYOUT.pools, layout_fingerprint=LAYOUT.fingerprint(), model_id="m", key_seed=3,
                         host_bytes=self.host_records * RECORD_BYTES, directory=self.directory,
                         disk_bytes=self.disk_records * RECORD_BYTES, faults=self.faults)

    def teardown(self) -> None:
        self.cache.abandon()
        shutil.rmtree(self.directory, ignore_errors=True)

    @rule(key=st.integers(0, KEYS - 1), kind=st.sampled_from(KINDS))
    def put(self, key: int, kind: str) -> None:
        self.cache.put(kind, key_of(key), key * 8, key * 8 + 8, payload(key, kind))

    @rule(keys=st.lists(st.tuples(st.integers(0, KEYS - 1), st.sampled_from(KINDS)), min_size=1, max_size=8))
    def fetch(self, keys: list[tuple[int, str]]) -> None:
        wanted = [Wanted(kind, key_of(key), key * 8, key * 8 + 8) for key, kind in keys]
        for (key, kind), got in zip(keys, self.cache.fetch(wanted), strict=True):
            assert got is None or bytes(got[1]) == payload(key, kind), (key, kind, got[0] if got else None)

    @rule(tier=st.sampled_from(["host", "disk"]))
    def evict(self, tier: str) -> None:
        self.cache.evict(tier)
        assert not (self.cache.host_order if tier == "host" else self.cache.disk_order)

    @rule(fault=st.sampled_from(FAULTS), count=st.integers(1, 3))
    def arm(self, fault: str, count: int) -> None:
        setattr(self.faults, fault, count)

    @rule()
    def drain(self) -> None:
        self.cache.drain()
        assert not self.cache.moving and self.cache.writer is not None and not self.cache.writer.pending

    @rule()
    def crash_and_reopen(self) -> None:
        self.cache.abandon()
        self.cache = self._open()

    @precondition(lambda self: not self.faults.armed)
    @rule()
    def close_and_reopen(self) -> None:
        self.cache.drain()  # a batch that failed before the faults were cleared is settled (dropped) first
        held = set(self.cache.host_order) | set(self.cache.disk_order)
        self.cache.close()
        self.cache = self._open()
        kept = set(self.cache.disk_order)
        # a clean close keeps every record the disk budget holds (the least recent go first)
        assert kept <= held and len(kept) == min(len(held), self.disk_records), (sorted(held), sorted(kept))

    @invariant()
    def within_budgets(self) -> None:
        assert self.cache.host.used_bytes <= self.cache.host.budget
        assert self.cache.disk is not None and self.cache.disk.used_bytes <= self.cache.disk.budget

    @invariant()
    def the_disk_index_is_the_disk(self) -> None:
        """Every indexed disk record is on disk, and every record on disk is indexed or still settling."""
        assert self.cache.disk is not None
        sizes = set(self.cache.disk.sizes)
        assert set(self.cache.disk_order) <= sizes <= set(self.cache.disk_order) | self.cache.moving

    @invariant()
    def every_record_is_one_name_in_one_place(self) -> None:
        assert not set(self.cache.host_order) & set(self.cache.disk_order)
        for name in self.cache.host_order:
            assert name in {record_name(key_of(k), kind) for k in range(KEYS) for kind in KINDS}


TestTierCacheMachine = TierCacheMachine.TestCase
TestTierCacheMachine.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)


class BigHostMachine(TierCacheMachine):
    """A host arena larger than the disk budget: closing and demoting must keep the newest, not empty it."""

    host_records, disk_records = 12, 5


TestBigHostMachine = BigHostMachine.TestCase
TestBigHostMachine.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)


class FlippingDisk(TierCacheMachine):
    """Every disk write gets a flipped payload byte."""

    def __init__(self) -> None:
        super().__init__()
        self.faults.flip_byte = 10**6


def test_the_machine_catches_a_cache_that_serves_without_checksums(monkeypatch: pytest.MonkeyPatch) -> None:
    def same(_data: object) -> bytes:
        return bytes(16)

    monkeypatch.setattr(disk_store, "checksum", same)
    monkeypatch.setattr(record_check, "checksum", same)
    monkeypatch.setattr(disk_writer, "checksum", same)
    quick = settings(max_examples=200, stateful_step_count=25, deadline=None, database=None, phases=[Phase.generate],
                     derandomize=True)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(FlippingDisk, settings=quick)


def test_with_its_checksums_the_cache_serves_no_flipped_byte() -> None:
    quick = settings(max_examples=100, stateful_step_count=25, deadline=None, database=None, phases=[Phase.generate],
                     derandomize=True)
    run_state_machine_as_test(FlippingDisk, settings=quick)
