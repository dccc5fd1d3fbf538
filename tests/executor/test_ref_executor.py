"""The executor interface and the NumPy reference executor: plans as data, version checks by the plan's
authority at launch, every op, static pools, and manager-issued plans (verify, complete, late replays)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hkv_core.errors import InvalidExecutorState
from hkv_core.executor import Executor, PlanAuthority, PoolBinding, TrustingAuthority
from hkv_core.layout import Layout
from hkv_core.manager import (
    CacheManager,
    CopyPages,
    InvalidArgument,
    InvalidRequestState,
    ManagerConfig,
    StaleLease,
    UnknownPlan,
)
from hkv_core.plan import (
    Checksum,
    Completion,
    FillPages,
    LoadRecord,
    Plan,
    StoreRecord,
    page_digest,
    version_checks,
)
from hkv_exec_ref import Engine, RefExecutor

LAYOUT = Layout.from_preset("tiny_v4")
POOLS = {p.name: p for p in LAYOUT.pools}
WINDOW, TAIL = "csa.swa_window", "csa.compressor_tail"


class Versions:
    """A plan authority for standalone tests: page versions in a dict tests can move."""

    def __init__(self, pages: int) -> None:
        self.versions = {name: np.zeros(pages, np.int64) for name in POOLS}
        self.verified = 0

    def verify(self, plan: Plan) -> None:
        self.verified += 1
        for check in plan.checks():
            found = int(self.versions[check.pool][check.page])
            if found != check.version:
                raise StaleLease(pool=check.pool, page=check.page, expected_version=check.version,
                                 found_version=found, request_id=plan.request_id)


def bound(pages: int = 6) -> tuple[RefExecutor, dict[str, np.ndarray]]:
    """An executor over every tiny_v4 pool; versions come from a dict tests can move."""
    authority = Versions(pages)
    ex = RefExecutor()
    ex.bind([PoolBinding(spec=s, pages=pages) for s in POOLS.values()], authority)
    versions = authority.versions
    rng = np.random.default_rng(7)
    for array in ex.pools.values():
        array[1:] = rng.standard_normal(array[1:].shape).astype(array.dtype)
    return ex, versions


def sample_plan() -> Plan:
    return Plan(ops=(CopyPages(pool=WINDOW, src=1, dst=2, entries=3, src_version=0),
                     FillPages(pool=TAIL, pages=(3,), versions=(0,), value=0),
                     Checksum(pool=WINDOW, pages=(1, 2), versions=(0, 0)),
                     StoreRecord(pool=WINDOW, runs=((1, 0, 8), (4, 0, 8)), versions=(0, 0), record="r1"),
                     LoadRecord(pool=WINDOW, runs=((5, 0, 8), (3, 0, 8)), versions=(0, 0), record="r1")),
                request_id=7, label="sample")


def records() -> dict[str, np.ndarray]:
    """The host buffer of sample_plan's record: two window pages (1 layer x 8 entries x 16 fp32 each)."""
    return {"r1": np.zeros(2 * 8 * 16 * 4, np.uint8)}


def test_ref_executor_satisfies_the_protocol() -> None:
    executor: Executor = RefExecutor()
    assert hasattr(executor, "bind") and hasattr(executor, "run")
    authority: PlanAuthority = TrustingAuthority()
    authority.verify(sample_plan())  # checks nothing, raises nothing
    strict = Versions(6)
    checked: PlanAuthority = strict
    checked.verify(sample_plan())
    strict.versions[WINDOW][1] = 5
    with pytest.raises(StaleLease):
        checked.verify(sample_plan())


def test_a_trusting_authority_runs_plans_built_by_hand() -> None:
    ex = RefExecutor()
    ex.bind([PoolBinding(spec=s, pages=6) for s in POOLS.values()], TrustingAuthority())
    assert ex.run(sample_plan(), records=records()).ops_run == 5
    with pytest.raises(InvalidExecutorState, match="bind once"):
        ex.bind([PoolBinding(spec=s, pages=6) for s in POOLS.values()], TrustingAuthority())


def test_run_before_bind_is_a_typed_error() -> None:
    with pytest.raises(InvalidExecutorState, match="bind"):
        RefExecutor().run(sample_plan(), records=records())


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
    assert text.splitlines()[0] == "plan -1 sample (request 7, 5 ops)" and "CopyPages(pool='csa.swa_window'" in text
    assert Plan.from_json(plan.to_json()) == plan
    issued = Plan(ops=plan.ops, request_id=7, label="sample", plan_id=3)
    assert issued != plan and Plan.from_json(issued.to_json()) == issued and issued.describe().startswith("plan 3 ")
    assert [c.page for op in plan.ops for c in version_checks(op)] == [1, 3, 1, 2, 1, 4, 5, 3]


def test_every_op_does_what_it_says() -> None:
    ex, _ = bound()
    before = {name: array.copy() for name, array in ex.pools.items()}
    done = ex.run(sample_plan(), records=records())
    w, b = ex.pools[WINDOW], before[WINDOW]
    assert np.array_equal(w[2, :, :3], b[1, :, :3]) and np.array_equal(w[2, :, 3:], b[2, :, 3:])
    assert not ex.pools[TAIL][3].any()
    assert done.digests == ((page_digest(b[1].tobytes()), page_digest(w[2].tobytes())),)
    assert np.array_equal(w[5], b[1]) and np.array_equal(w[3], b[4])  # stored (1, 4), loaded into (5, 3)
    assert (done.ops_run, done.pages_moved, done.entries_copied) == (5, 6, 3)
    for name in POOLS:
        if name not in (WINDOW, TAIL):
            assert np.array_equal(ex.pools[name], before[name])


def test_a_pool_replaced_after_bind_is_caught_by_the_next_plan_over_it() -> None:
    """Pools are static: a plan over a pool whose buffer moved after bind fails its check (a debug assert)."""
    ex, _ = bound()
    ex.pools[WINDOW] = ex.pools[WINDOW].copy()  # what an engine that reallocates a pool would do
    with pytest.raises(AssertionError, match="a pool moved"):
        ex.run(sample_plan(), records=records())


def test_replaying_a_plan_on_two_executors_gives_the_same_bytes() -> None:
    (a, _), (b, _) = bound(), bound()
    plan = Plan.from_json(sample_plan().to_json())
    a.run(sample_plan(), records=records())
    b.run(plan, records=records())
    assert all(np.array_equal(a.pools[n], b.pools[n]) for n in POOLS)


@pytest.mark.parametrize("moved", range(5))
def test_a_moved_version_refuses_the_whole_plan(moved: int) -> None:
    ex, versions = bound()
    pool, page = [(WINDOW, 1), (TAIL, 3), (WINDOW, 2), (WINDOW, 4), (WINDOW, 3)][moved]
    versions[pool][page] += 1
    before = {name: array.copy() for name, array in ex.pools.items()}
    with pytest.raises(StaleLease) as err:
        ex.run(sample_plan(), records=records())
    assert (err.value.pool, err.value.page, err.value.request_id) == (pool, page, 7)
    assert all(np.array_equal(ex.pools[n], before[n]) for n in POOLS), "nothing of the plan ran"
    assert ex.tally.ops == 0


def test_null_page_is_never_a_destination() -> None:
    ex, _ = bound()
    with pytest.raises(InvalidArgument):
        ex.run(Plan(ops=(CopyPages(pool=WINDOW, src=1, dst=0, entries=1, src_version=0),)))
    with pytest.raises(InvalidArgument):
        ex.write(WINDOW, [3], np.zeros((1, 1, 16), np.float32))
    with pytest.raises(InvalidArgument):
        LoadRecord(pool=WINDOW, runs=((0, 0, 1),), versions=(0,), record="x")
    ex.write(WINDOW, [8 * 2 + 5], np.full((1, 1, 16), 3.0, np.float32))
    assert np.all(ex.read(WINDOW, [2])[0, 0, 5] == 3.0)


def test_the_manager_is_the_authority_of_its_pages() -> None:
    manager = CacheManager(LAYOUT, ManagerConfig(default_pool_pages=4, key_seed=0))
    ex = RefExecutor()
    ex.bind(manager.bindings(), manager)
    assert ex.pools[WINDOW].shape[0] == 5 and set(ex.pools) == set(POOLS)
    with pytest.raises(StaleLease) as err:  # nothing is placed in page 2 yet
        ex.run(Plan(ops=(Checksum(pool=WINDOW, pages=(2,), versions=(0,)),)))
    assert err.value.found_state == "FREE" and ex.tally.ops == 0
    rid = manager.add_request(np.arange(16))
    manager.allocate(rid, 16)
    manager.commit(rid, 16)
    manager.release(rid)
    view = manager.pages(WINDOW)
    published = [int(p) for p, s in zip(view.pages, view.states, strict=True) if s == "PUBLISHED"]
    assert published
    page, version = published[0], int(view.versions[published[0]])
    assert ex.run(Plan(ops=(Checksum(pool=WINDOW, pages=(page,), versions=(version,)),))).ops_run == 1
    with pytest.raises(StaleLease) as err:
        ex.run(Plan(ops=(Checksum(pool=WINDOW, pages=(page,), versions=(version + 1,)),)))
    assert (err.value.found_version, err.value.expected_version) == (version, version + 1)
    with pytest.raises(StaleLease) as err:  # the manager knows no such pool (the executor would not run it)
        manager.verify(Plan(ops=(Checksum(pool="no.such_pool", pages=(1,), versions=(0,)),)))
    assert err.value.found_state == "NO_POOL"


def hit_with_a_copy_plan() -> tuple[CacheManager, RefExecutor, int, Plan]:
    """Request 0 caches a 40-token prompt; request 1 resumes at 40 and allocates: its working tail pages are
    seeded from the hit's snapshot pages by a copy plan."""
    m = CacheManager(LAYOUT, ManagerConfig(default_pool_pages=8, retain_every_blocks=1, key_seed=0,
                                           evict_slack_shift=None))
    ex = RefExecutor()
    ex.bind(m.bindings(), m)
    prompt = np.arange(40) % 50
    first = m.add_request(prompt)
    m.allocate(first, 40)
    m.commit(first, 40)
    m.release(first)
    rid = m.add_request(np.concatenate([prompt, np.ones(8, np.int64)]))
    hit = m.match(rid)
    assert hit.tokens == 40
    m.acquire(rid, hit)
    alloc = m.allocate(rid, 8)
    assert alloc.plan is not None and alloc.plan.plan_id >= 0 and alloc.plan.ops == tuple(alloc.copies)
    return m, ex, rid, alloc.plan


def states(m: CacheManager, plan: Plan, end: str) -> list[str]:
    """The state of each copy's source (end="src") or target (end="dst") page."""
    return [m.pages(op.pool, [getattr(op, end)]).states[0] for op in plan.ops if isinstance(op, CopyPages)]


def test_complete_moves_the_targets_out_of_filling_once() -> None:
    m, ex, rid, plan = hit_with_a_copy_plan()
    assert states(m, plan, "dst") == ["FILLING"] * len(plan.ops)
    assert states(m, plan, "src") == ["PUBLISHED"] * len(plan.ops)
    with pytest.raises(InvalidRequestState):
        m.commit(rid, 8)  # the plan is in flight
    before = m.snapshot()
    with pytest.raises(InvalidRequestState):
        m.release(rid)
    assert m.snapshot() == before
    done = ex.run(plan)
    assert done.ok and done.ops_run == len(plan.ops) and done.entries_copied > 0
    m.complete(plan.plan_id, done)
    assert states(m, plan, "dst") == ["RESERVED"] * len(plan.ops)
    before = m.snapshot()
    with pytest.raises(UnknownPlan):
        m.complete(plan.plan_id, Completion())
    assert m.snapshot() == before
    m.commit(rid, 8)
    m.release(rid)


@pytest.mark.parametrize("completion", [None, True, "ok", {"ok": True}], ids=repr)
def test_complete_refuses_a_bad_completion_and_the_plan_stays_in_flight(completion: object) -> None:
    m, ex, rid, plan = hit_with_a_copy_plan()
    before = m.snapshot()
    with pytest.raises(InvalidArgument) as err:
        m.complete(plan.plan_id, completion)  # type: ignore[arg-type]  # what the test is about
    assert (err.value.action, err.value.argument) == ("complete", "completion") and err.value.value is completion
    assert m.snapshot() == before  # the plan was not dropped: the request is not stuck
    with pytest.raises(InvalidRequestState, match="still in flight"):
        m.commit(rid, 8)
    m.complete(plan.plan_id, ex.run(plan))
    assert states(m, plan, "dst") == ["RESERVED"] * len(plan.ops)
    m.commit(rid, 8)
    m.release(rid)


def test_complete_takes_a_numpy_integer_plan_id() -> None:
    m, ex, rid, plan = hit_with_a_copy_plan()
    m.complete(np.int64(plan.plan_id), ex.run(plan))  # type: ignore[arg-type]  # an id read from an array
    assert states(m, plan, "dst") == ["RESERVED"] * len(plan.ops)
    before = m.snapshot()
    for plan_id in (np.int32(plan.plan_id), plan.plan_id, "0", None, True):
        with pytest.raises(UnknownPlan):
            m.complete(plan_id, Completion())  # type: ignore[arg-type]
    assert m.snapshot() == before
    m.commit(rid, 8)
    m.release(rid)


def test_a_plan_run_late_is_refused_once_its_source_page_moved() -> None:
    m, ex, rid, plan = hit_with_a_copy_plan()
    m.complete(plan.plan_id, Completion(ok=False, error="never ran"))
    with pytest.raises(InvalidRequestState):
        m.commit(rid, 8)  # a failed copy: the request cannot use its targets
    m.release(rid)
    assert m.evict() > 0
    assert states(m, plan, "src") == ["FREE"] * len(plan.ops)
    with pytest.raises(StaleLease) as err:
        m.verify(plan)
    assert err.value.found_state == "FREE"
    other = m.add_request(np.arange(100, 148))
    m.allocate(other, 48)  # lowest pages first: the sources' pages are placements of new objects now
    assert states(m, plan, "src") == ["RESERVED"] * len(plan.ops)
    copy = plan.ops[0]
    assert isinstance(copy, CopyPages)
    assert int(m.pages(copy.pool, [copy.src]).versions[0]) != copy.src_version
    before = {name: array.copy() for name, array in ex.pools.items()}
    with pytest.raises(StaleLease) as err:
        ex.run(plan)
    assert (err.value.pool, err.value.page, err.value.expected_version) == (copy.pool, copy.src, copy.src_version)
    assert err.value.found_state == "RESERVED" and err.value.request_id == rid
    assert all(np.array_equal(ex.pools[n], before[n]) for n in ex.pools), "nothing of the plan ran"
    assert ex.tally.ops == 0


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
