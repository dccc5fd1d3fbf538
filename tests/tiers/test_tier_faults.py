"""The fault suite: every disk fault class switched on under the oracle, each exercised and counted.

After a warm-up, a fault is armed for several operations and the workload goes
on with the device and host emptied between rounds, so every round writes to
and reads from disk.  Whatever fires, every response equals recomputation
(checked inside `Sessions.round`), no page leaks, and the fault is counted where
it was handled.  Two deliberately broken variants show the oracle catches what
the checks prevent: records served without their checksums, and resume points
stored without their compressor tails.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tier_workload import Sessions, pages_leaked, tiny

from hkv_exec_ref.engine import Engine
from hkv_tiers import DiskFaults, disk_store, disk_writer, record_check, span_io

ARMED = 3  # operations each fault hits

# fault switch -> (where the handling is counted: "disk" store counts or "cache" counts, counter name)
HANDLED = {
    "eio_write": [("disk", "write_EIO"), ("cache", "write_failed")],
    "enospc_write": [("disk", "write_ENOSPC"), ("cache", "write_failed")],
    "eio_read": [("disk", "read_error"), ("cache", "missed_disk")],
    "torn_write": [("disk", "quarantined"), ("cache", "missed_disk")],
    "flip_byte": [("disk", "quarantined"), ("cache", "missed_disk")],
    "slow_io": [("cache", "loaded_disk")],  # slow reads and writes still complete, off the request's thread
}


def churn(engine: Engine, sessions: Sessions, rounds: int) -> None:
    """Rounds with the device and host emptied before each: every block comes back from disk."""
    for _ in range(rounds):
        engine.evict("device")
        engine.evict("host")
        sessions.round(engine)


@pytest.mark.parametrize("fault", sorted(HANDLED))
def test_every_fault_class_is_handled_under_the_oracle(tmp_path: Path, fault: str) -> None:
    faults = DiskFaults(seed=7, slow_seconds=0.001)
    engine = tiny(tmp_path, disk_faults=faults)
    sessions = Sessions()
    churn(engine, sessions, 1)
    setattr(faults, fault, ARMED)
    churn(engine, sessions, 3)
    assert faults.fired[fault] == ARMED, faults.fired  # the fault class was exercised
    assert engine.tiers is not None
    report = engine.tiers.cache.report()
    for where, counter in HANDLED[fault]:
        counts = report["disk_counts"] if where == "disk" else report["counts"]
        assert counts.get(counter, 0) >= 1, (fault, counter, report)
    assert report["faults_fired"] == {fault: ARMED}
    assert pages_leaked(engine) == {}
    engine.close()


def test_a_restart_mid_workload_without_close_keeps_serving_exactly(tmp_path: Path) -> None:
    engine = tiny(tmp_path)
    sessions = Sessions()
    churn(engine, sessions, 2)
    assert engine.tiers is not None
    engine.tiers.cache.abandon()  # a process death: the host tier's records are lost, the disk's stay
    reopened = tiny(tmp_path)
    churn(reopened, sessions, 2)
    assert reopened.stats.cached_by_tier["disk"] > 0
    reopened.close()


def test_broken_variant_records_served_without_checksums_change_outputs(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def same(_data: object) -> bytes:
        return bytes(16)

    monkeypatch.setattr(disk_store, "checksum", same)
    monkeypatch.setattr(record_check, "checksum", same)
    monkeypatch.setattr(disk_writer, "checksum", same)
    faults = DiskFaults(seed=3)
    engine = tiny(tmp_path, disk_faults=faults)
    sessions = Sessions()
    churn(engine, sessions, 1)
    faults.flip_byte = 1_000
    with pytest.raises(AssertionError, match="served output differs"):
        churn(engine, sessions, 3)


def test_broken_variant_resume_points_stored_without_tails_change_outputs(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    whole = span_io.rows

    def no_tails(layout: span_io.Layout, spec: span_io.PoolSpec, lo: int, hi: int) -> tuple[int, int]:
        return (0, 0) if spec.entry_kind is span_io.EntryKind.TAIL_ROW else whole(layout, spec, lo, hi)

    monkeypatch.setattr(span_io, "rows", no_tails)
    engine = tiny(tmp_path)
    with pytest.raises(AssertionError, match="served output differs"):
        churn(engine, Sessions(), 3)
