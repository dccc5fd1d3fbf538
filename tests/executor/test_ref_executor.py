"""The executor interface and the NumPy reference executor: plans as data, version checks,
every op, static pools."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hkv_core.executor import Executor, PoolBinding, bindings_for, versions_for
from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, CopyPages, ManagerConfig, StaleLease
from hkv_core.plan import Checksum, FillPages, LoadRecord, Plan, StoreRecord, page_digest, version_checks
from hkv_exec_ref import Engine, RefExecutor

LAYOUT = Layout.from_preset("tiny_v4")
POOLS = {p.name: p for p in LAYOUT.pools}
WINDOW, TAIL = "csa.swa_window", "csa.compressor_tail"


def bound(pages: int = 6) -> tuple[RefExecutor, dict[str, np.ndarray]]:
    """An executor over every tiny_v4 pool; versions come from a dict tests can move."""
    versions = {name: np.zeros(pages, np.uint32) for name in POOLS}
    ex = RefExecutor()
    ex.bind([PoolBinding(spec=s, pages=pages) for s in POOLS.values()], lambda pool, p: versions[pool][p])
    rng = np.random.default_rng(7)
    for array in ex.pools.values():
        array[1:] = rng.standard_normal(array[1:].shape).astype(array.dtype)
    return ex, versions


def sample_plan() -> Plan:
    return Plan(ops=(CopyPages(pool=WINDOW, src=1, dst=2, entries=3, src_version=0),
                     FillPages(pool=TAIL, pages=(3,), versions=(0,), value=0),
                     Checksum(pool=WINDOW, pages=(1, 2), versions=(0, 0)),
                     StoreRecord(pool=WINDOW, pages=(1, 4), versions=(0, 0), record="r1"),
                     LoadRecord(pool=WINDOW, pages=(5, 3), versions=(0, 0), record="r1")),
                request_id=7, label="sample")


def test_ref_executor_satisfies_the_protocol() -> None:
    executor: Executor = RefExecutor()
    assert hasattr(executor, "bind") and hasattr(executor, "run")


def test_pool_shapes_follow_the_pool_specs() -> None:
    ex, _ = bound(pages=5)
    for name, spec in POOLS.items():
        assert ex.pools[name].shape == (5, spec.layer_count, spec.entries_per_page, *spec.entry_shape)
        assert ex.pools[name].dtype == np.float32
        assert ex.pools[name][0].nbytes == spec.page_bytes * spec.layer_count
    assert ex.pools[TAIL].shape == (5, 1, 8, 2, 32)


def test_plans_print_compare_and_round_trip_through_json() -> None:
    plan = sample_plan()
    assert plan == sample_plan() and plan != Plan(ops=plan.ops[:2], request_id=7, label="sample")
    text = plan.describe()
    assert text.splitlines()[0] == "plan sample (request 7, 5 ops)" and "CopyPages(pool='csa.swa_window'" in text
    assert Plan.from_json(plan.to_json()) == plan
    assert [c.page for op in plan.ops for c in version_checks(op)] == [1, 3, 1, 2, 1, 4, 5, 3]


def test_every_op_does_what_it_says() -> None:
    ex, _ = bound()
    before = {name: array.copy() for name, array in ex.pools.items()}
    done = ex.run(sample_plan())
    w, b = ex.pools[WINDOW], before[WINDOW]
    assert np.array_equal(w[2, :, :3], b[1, :, :3]) and np.array_equal(w[2, :, 3:], b[2, :, 3:])
    assert not ex.pools[TAIL][3].any()
    assert done.digests == ((page_digest(b[1].tobytes()), page_digest(w[2].tobytes())),)
    assert np.array_equal(w[5], b[1]) and np.array_equal(w[3], b[4])  # stored (1, 4), loaded into (5, 3)
    assert (done.ops_run, done.pages_moved, done.entries_copied) == (5, 6, 3)
    for name in POOLS:
        if name not in (WINDOW, TAIL):
            assert np.array_equal(ex.pools[name], before[name])


def test_replaying_a_plan_on_two_executors_gives_the_same_bytes() -> None:
    (a, _), (b, _) = bound(), bound()
    plan = Plan.from_json(sample_plan().to_json())
    a.run(sample_plan())
    b.run(plan)
    assert all(np.array_equal(a.pools[n], b.pools[n]) for n in POOLS)


@pytest.mark.parametrize("moved", range(5))
def test_a_moved_version_refuses_the_whole_plan(moved: int) -> None:
    ex, versions = bound()
    pool, page = [(WINDOW, 1), (TAIL, 3), (WINDOW, 2), (WINDOW, 4), (WINDOW, 3)][moved]
    versions[pool][page] += 1
    before = {name: array.copy() for name, array in ex.pools.items()}
    with pytest.raises(StaleLease) as err:
        ex.run(sample_plan())
    assert (err.value.pool, err.value.page, err.value.request_id) == (pool, page, 7)
    assert all(np.array_equal(ex.pools[n], before[n]) for n in POOLS), "nothing of the plan ran"
    assert not ex.host and ex.tally.ops == 0


def test_null_page_is_never_a_destination() -> None:
    ex, _ = bound()
    with pytest.raises(AssertionError):
        ex.run(Plan(ops=(CopyPages(pool=WINDOW, src=1, dst=0, entries=1, src_version=0),)))
    with pytest.raises(AssertionError):
        ex.write(WINDOW, [3], np.zeros((1, 1, 16), np.float32))
    with pytest.raises(AssertionError):
        LoadRecord(pool=WINDOW, pages=(0,), versions=(0,), record="x")
    ex.write(WINDOW, [8 * 2 + 5], np.full((1, 1, 16), 3.0, np.float32))
    assert np.all(ex.read(WINDOW, [2])[0, 0, 5] == 3.0)


def test_versions_come_from_the_manager_pools() -> None:
    manager = CacheManager(LAYOUT, ManagerConfig(default_pool_pages=4, seed=0))
    ex = RefExecutor()
    ex.bind(bindings_for(manager), versions_for(manager))
    assert ex.pools[WINDOW].shape[0] == 5
    manager.core.pools[manager.core.pool_index[WINDOW]].version[2] += 1
    with pytest.raises(StaleLease):
        ex.run(Plan(ops=(Checksum(pool=WINDOW, pages=(2,), versions=(0,)),)))
    assert ex.run(Plan(ops=(Checksum(pool=WINDOW, pages=(2,), versions=(1,)),))).ops_run == 1


WORKLOAD = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 40), st.integers(0, 3),
                              st.sampled_from([None, 1, 3, 7, 20]), st.booleans()), min_size=1, max_size=6)


@settings(max_examples=8)
@given(WORKLOAD)
def test_pool_addresses_never_change_across_a_workload(requests: list[tuple[int, int, int, int | None, bool]]
                                                         ) -> None:
    engine = Engine.tiny(default_pool_pages=24, retain_every_blocks=1)
    addresses = engine.executor.addresses()
    assert addresses == engine.addresses
    bases = [np.random.default_rng(b).integers(0, 64, 48) for b in range(3)]
    for base, length, new, chunk, evict in requests:
        engine.generate(bases[base][:length], new, chunk_tokens=chunk)
        if evict:
            engine.evict()
        assert engine.executor.addresses() == addresses
