"""Tier stores and loads are plans the manager issues and `complete` settles (hkv_core/manager/record_plans.py).

- a load's targets are FILLING (copy-pinned) while its plan is in flight, RESERVED again after `complete`;
- a load into a page the request did not reserve, or past what it committed, is refused with nothing changed;
- a failed load plan costs a recompute of the same pages: the engine's output is still exact (and a variant
  that commits the failed load's rows instead is caught by the oracle);
- record ops check their buffers before anything runs, on both executors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tier_workload import tiny

from hkv_core import Layout
from hkv_core.errors import IllegalTransition, InvalidArgument, StaleLease
from hkv_core.manager import CacheManager, ManagerConfig, check_invariants
from hkv_core.plan import Completion, LoadRecord, Plan, RecordRows, StoreRecord
from hkv_exec_cuda import CudaExecutor, numpy_backend
from hkv_exec_ref import RefExecutor
from hkv_tiers import link

LAYOUT = Layout.from_preset("tiny_v4")
WINDOW = "csa.swa_window"


def manager_with_request() -> tuple[CacheManager, RefExecutor, int, list[int]]:
    manager = CacheManager(LAYOUT, ManagerConfig(default_pool_pages=8, key_seed=0))
    executor = RefExecutor()
    executor.bind(manager.bindings(), manager)
    rid = manager.add_request(np.arange(40) % 64)
    manager.acquire(rid, manager.match(rid))
    manager.allocate(rid, 32)
    return manager, executor, rid, manager.owned(rid)[WINDOW]


def state(manager: CacheManager, pages: list[int]) -> list[str]:
    return [str(s) for s in manager.pages(WINDOW, pages).states]


def test_a_load_pins_its_targets_until_complete_and_then_they_commit() -> None:
    manager, executor, rid, pages = manager_with_request()
    rows = [RecordRows(pool=WINDOW, runs=[(pages[0], 0, 8)], record="r")]
    plan = manager.plan_load(rid, rows)
    assert state(manager, pages[:1]) == ["FILLING"] and not check_invariants(manager)
    with pytest.raises(InvalidArgument, match="not a page request"):
        manager.plan_load(rid, rows)  # already FILLING: one load at a time
    source = np.random.default_rng(0).integers(0, 256, 8 * 16 * 4, dtype=np.uint8)
    manager.complete(plan.plan_id, executor.run(plan, records={"r": source}))
    assert state(manager, pages[:1]) == ["RESERVED"]
    assert executor.read(WINDOW, [pages[0]]).view(np.uint8).reshape(-1).tobytes() == source.tobytes()
    manager.commit(rid, 32)
    assert not check_invariants(manager)


def test_each_record_of_a_load_is_a_tier_load_through_the_spec() -> None:
    """plan_load fires `load` on a `tier_load` per record (LOADING, its targets marked); complete settles the
    records before their targets; the same record loads into two requests' pages at once."""
    manager, executor, rid, pages = manager_with_request()
    other = manager.add_request(np.arange(40) % 64 + 1)
    manager.acquire(other, manager.match(other))
    manager.allocate(other, 32)
    theirs = manager.owned(other)[WINDOW]
    first = manager.plan_load(rid, [RecordRows(pool=WINDOW, runs=[(pages[0], 0, 8)], record="a"),
                                    RecordRows(pool=WINDOW, runs=[(pages[1], 0, 8)], record="b")])
    second = manager.plan_load(other, [RecordRows(pool=WINDOW, runs=[(theirs[0], 0, 8)], record="a")])
    loads = manager.core.loads
    assert sorted(loads.loads) == [(first.plan_id, "a"), (first.plan_id, "b"), (second.plan_id, "a")]
    assert {loads.table.states[load.state] for load in loads.loads.values()} == {"LOADING"}
    assert int(manager.core.objects.loads.sum()) == 3 and not check_invariants(manager)
    source = np.zeros(8 * 16 * 4, np.uint8)
    manager.complete(first.plan_id, Completion(ok=False, error="test: copy failed"))
    assert sorted(loads.loads) == [(second.plan_id, "a")] and not check_invariants(manager)
    manager.complete(second.plan_id, executor.run(second, records={"a": source}))
    assert not loads.loads and not manager.core.objects.loads.any() and not check_invariants(manager)
    seen = set()
    manager.core.objects.seen = seen
    manager.complete(manager.plan_load(rid, [RecordRows(pool=WINDOW, runs=[(pages[0], 0, 8)], record="a")])
                     .plan_id, Completion())
    assert {("tier_load", "load"), ("tier_load", "copy_done")} <= seen


def test_a_broken_tier_load_mark_is_caught_by_the_invariant() -> None:
    """Broken variant: a load's target loses its mark while the load is in flight (its copy_done could then
    pass guard `no_load_in_flight` early); tier_loads_pinned reports it."""
    manager, executor, rid, pages = manager_with_request()
    manager.plan_load(rid, [RecordRows(pool=WINDOW, runs=[(pages[0], 0, 8)], record="a")])
    manager.core.objects.loads[:] = 0
    assert any(m.startswith("tier_loads_pinned:") for m in check_invariants(manager))


def test_a_load_is_refused_into_pages_it_may_not_write_and_nothing_changes() -> None:
    manager, executor, rid, pages = manager_with_request()
    other = manager.add_request(np.arange(40) % 64 + 1)
    before = manager.snapshot()
    with pytest.raises(InvalidArgument, match="not a page request"):
        manager.plan_load(other, [RecordRows(pool=WINDOW, runs=[(pages[0], 0, 8)], record="r")])
    with pytest.raises(InvalidArgument, match="outside"):
        manager.plan_load(rid, [RecordRows(pool=WINDOW, runs=[(999, 0, 8)], record="r")])
    with pytest.raises(InvalidArgument, match="RecordRows"):
        manager.plan_load(rid, [])
    assert manager.snapshot() == before
    manager.release(other)
    manager.commit(rid, 32)
    with pytest.raises((InvalidArgument, IllegalTransition)):
        manager.plan_load(rid, [RecordRows(pool=WINDOW, runs=[(pages[0], 0, 8)], record="r")])  # committed rows


def test_a_load_plan_built_by_hand_is_refused_at_launch() -> None:
    manager, executor, rid, pages = manager_with_request()
    op = LoadRecord(pool=WINDOW, runs=[(pages[0], 0, 8)], versions=[int(manager.pages(WINDOW, pages[:1])
                                                                         .versions[0])], record="r")
    with pytest.raises(StaleLease):  # its target is not FILLING for the request: the manager did not issue it
        executor.run(Plan(ops=[op], request_id=rid), records={"r": np.zeros(512, np.uint8)})


def test_a_store_reads_through_a_plan_and_moves_no_object() -> None:
    manager, executor, rid, pages = manager_with_request()
    before = manager.snapshot()
    plan = manager.plan_store(rid, [RecordRows(pool=WINDOW, runs=[(pages[1], 2, 6)], record="r")])
    assert manager.snapshot() == before and plan.ops[0].rows == 4
    out = np.zeros(4 * 16 * 4, np.uint8)
    executor.run(plan, records={"r": out})
    assert np.array_equal(out.view(np.float32).reshape(1, 4, 16), executor.read(WINDOW, [pages[1]])[0][:, 2:6])


@pytest.mark.parametrize("make", [RefExecutor, lambda: CudaExecutor(numpy_backend())], ids=["ref", "cuda-stand-in"])
@pytest.mark.parametrize("records, problem", [
    ({}, "no host buffer"),
    ({"r": np.zeros(100, np.uint8)}, "past its"),
    ({"r": np.zeros(512, np.float32)}, "1-d uint8"),
    ({"r": np.frombuffer(bytes(512), np.uint8)}, "writable"),
], ids=["missing", "short", "dtype", "read-only"])
def test_record_ops_check_their_buffers_before_anything_runs(make: Any, records: dict, problem: str) -> None:
    manager = CacheManager(LAYOUT, ManagerConfig(default_pool_pages=8, key_seed=0))
    executor = make()
    executor.bind(manager.bindings(), manager)
    plan = Plan(ops=[StoreRecord(pool=WINDOW, runs=[(1, 0, 8)], versions=[0], record="r")])
    with pytest.raises(InvalidArgument, match=problem):
        executor.run(plan, records=records)
    assert executor.tally.ops == 0


def test_a_failed_tier_load_is_recomputed_and_the_output_stays_exact(tmp_path: Path,
                                                                   failing_loads: RefExecutor) -> None:
    engine = tiny(tmp_path, executor=failing_loads)
    prompt = np.arange(40) % 64
    first = engine.generate(prompt, 3)
    engine.evict("device")
    again = engine.generate(prompt, 3)
    assert again.tier_decision is not None and again.tier_decision.action == "load"
    assert again.cached_by_tier["host"] == 0 and engine.tiers is not None
    assert engine.tiers.cache.counts["load_failed"] == 1
    assert again.same_outputs(first) and engine.matches_recompute(prompt, again)
    engine.close()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the model reads the garbage the failed copy left
def test_committing_a_failed_load_instead_of_recomputing_is_caught(tmp_path: Path, failing_loads: RefExecutor,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken variant: the link ignores the failed completion and commits what the copy left - the model
    then reads garbage state (it trips over non-finite compressor rows) or serves a different output."""
    real = link.span_io.run_load
    monkeypatch.setattr(link.span_io, "run_load", lambda *a: (real(*a), Completion())[1])
    engine = tiny(tmp_path, executor=failing_loads)
    prompt = np.arange(40) % 64
    first = engine.generate(prompt, 3)
    engine.evict("device")
    try:
        again = engine.generate(prompt, 3)
    except AssertionError as err:
        assert "no real row" in str(err)
    else:
        assert again.cached_by_tier["host"] == 32
        assert not engine.matches_recompute(prompt, again) or not again.same_outputs(first)
    engine.close()


def test_a_failed_tier_load_after_a_device_hit_is_recomputed_from_the_hit(tmp_path: Path,
                                                                       failing_loads: RefExecutor) -> None:
    """A device hit at 16, then a load of [16, 32) whose plan scribbles over the working tails and fails: the
    recompute starts from the hit's tails again (the CSA tail's overlap rows are read at 16), output exact."""
    engine = tiny(tmp_path, executor=failing_loads)
    prompt = np.arange(40) % 64
    first = engine.generate(prompt, 3)
    rid = engine.manager.add_request(prompt[:17])  # pins the point at 16 through the eviction
    engine.manager.acquire(rid, engine.manager.match(rid))
    engine.evict("device")
    engine.manager.release(rid)
    again = engine.generate(prompt, 3)
    assert engine.tiers is not None and engine.tiers.cache.counts["load_failed"] == 1
    assert again.cached_by_tier["device"] == 16
    assert again.same_outputs(first) and engine.matches_recompute(prompt, again)
    engine.close()
