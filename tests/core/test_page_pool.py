"""PagePools, the owner of every page pool's objects and device pages, tested directly.

Built from a layout's page pools (tiny_v4: a window pool, prefix pools, tail
pools) with a request table of its own, so each lifecycle step is driven
explicitly:

- reserve hands out the lowest object ids and the lowest pages first, per pool;
  with no free page it is refused (IllegalTransition) and takes nothing; the
  guard `slot_available` reads the pools' free stacks;
- settle evicts what nobody holds or pins, retires what only a lease keeps
  (kinds that retire), reclaims retired objects once unpinned;
- versions are stamps unique over the pools' life: no two objects share one,
  and a page never sees the same version twice;
- a refused bulk step over objects in several states changes nothing, on the
  uniform path and on the per-state fallback.

Each comes with a broken variant the same check catches.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from hkv_core.block_keys import ExtraKeys
from hkv_core.errors import IllegalTransition
from hkv_core.layout import Layout
from hkv_core.manager import ManagerConfig, object_effects
from hkv_core.manager.lanes import build_lanes
from hkv_core.manager.object_view import ObjectView
from hkv_core.manager.page_pools import NULL_OBJECT, PagePools, PoolSlots
from hkv_core.manager.requests import RequestState, RequestTable
from hkv_core.manager.roles import events_fired
from hkv_core.spec import compile_lifecycle, load_lifecycle
from hkv_core.spec.names import Event
from hkv_core.spec.records import LifecycleSpec
from hkv_core.testing.spec_mutation import mutated_spec

PAGES = 4  # real pages per pool
ROWS = 8  # full_token of the objects reserved here (tiny_v4 blocks are 8 tokens)
WINDOW, PREFIX = 0, 1  # tiny_v4's page pools: 0 the windows (kind swa_window), 1 csa.compressed_kv
SCRATCH = ("stamp", "stamp_clock", "vdrop")  # scratch of guards and the eviction planner


def make(spec: LifecycleSpec | None = None, requests: int = 3) -> PagePools:
    lanes = build_lanes(Layout.from_preset("tiny_v4"), ManagerConfig(default_pool_pages=PAGES))
    table = RequestTable(requests)
    for _ in range(requests):  # live requests, so leases (pin lists) can be recorded for each slot
        table.admit(RequestState, tokens=np.zeros(0, np.int64), keys=np.zeros((0, 2), np.uint64),
                    extra=ExtraKeys(), prompt_tokens=0, lanes=len(lanes))
    return PagePools(lanes, compile_lifecycle(spec or load_lifecycle()), table, events_fired(lanes))


def demand(o: PagePools, counts: dict[int, int]) -> list[tuple[int, NDArray[np.int64], NDArray[np.int64]]]:
    return [(counts.get(p.index, 0), np.ones(counts.get(p.index, 0), np.int64),
             np.full(counts.get(p.index, 0), ROWS, np.int64)) for p in o.pools]


def reserve(o: PagePools, counts: dict[int, int], actor: int = 0) -> list[NDArray[np.intp]]:
    return o.reserve(demand(o, counts), actor)


def states(o: PagePools, objs: NDArray[np.integer] | list[int]) -> list[str]:
    return [o.state_name(int(b)) for b in objs]


def frozen(o: PagePools) -> tuple[Any, ...]:
    """Everything a step may change (scratch aside), copied."""
    arrays = tuple((k, v.tobytes()) for k, v in sorted(o.__dict__.items())
                   if isinstance(v, np.ndarray) and k not in SCRATCH)
    pools = tuple((p.slot_object.tobytes(), p.space.free[:p.free_slot_count].tobytes(), p.free_slot_count,
                   p.free_objects[:p.free_object_count].tobytes(), p.free_object_count) for p in o.pools)
    return arrays, pools, o.clock


def ids(*values: int) -> NDArray[np.intp]:
    return np.array(values, np.intp)


def publish(o: PagePools, objs: NDArray[np.intp], actor: int = 0, pinned: bool = False) -> None:
    """Objects of `actor` with every row written become PUBLISHED (pinned by `actor` when asked)."""
    o.requests.committed[actor] = ROWS
    if pinned:
        o.step(objs, Event.PUBLISH_PINNED, actor)
        req = o.requests.by_slot[actor]
        assert req is not None
        req.pins.add(objs, o.version[objs])
    else:
        o.step(objs, Event.PUBLISH, actor)


# ---------------------------------------------------------------------------------------------- reserve


def lowest_first_problems(o: PagePools) -> Iterator[str]:
    """Reserve, abort and reserve again: ids and pages must come lowest first, per pool."""
    w, p = o.pools[WINDOW], o.pools[PREFIX]
    got = reserve(o, {WINDOW: 2})
    if got[WINDOW].tolist() != [w.base, w.base + 1] or o.slot[got[WINDOW]].tolist() != [1, 2]:
        yield f"first reservation: objects {got[WINDOW].tolist()} pages {o.slot[got[WINDOW]].tolist()}"
    got = reserve(o, {WINDOW: 1, PREFIX: 2}, actor=1)
    if got[WINDOW].tolist() != [w.base + 2] or o.slot[got[WINDOW]].tolist() != [3]:
        yield f"second reservation (windows): {got[WINDOW].tolist()} pages {o.slot[got[WINDOW]].tolist()}"
    if got[PREFIX].tolist() != [p.base, p.base + 1] or o.slot[got[PREFIX]].tolist() != [1, 2]:
        yield "pools hand out their own lowest ids and pages"
    o.step(ids(w.base + 1), Event.ABORT, 0)
    again = reserve(o, {WINDOW: 2}, actor=2)[WINDOW]
    if again.tolist() != [w.base + 1, w.base + 3] or o.slot[again].tolist() != [2, 4]:
        yield f"after an abort: objects {again.tolist()} pages {o.slot[again].tolist()}"


def test_reserve_hands_out_the_lowest_ids_and_pages_first() -> None:
    o = make()
    assert list(lowest_first_problems(o)) == []
    w = o.pools[WINDOW]
    mine = ids(w.base, w.base + 1, w.base + 2, w.base + 3)
    assert states(o, mine) == ["RESERVED"] * 4 and o.owner[mine].tolist() == [0, 2, 1, 2]
    assert o.row_token[mine].tolist() == [1] * 4 and o.full_token[mine].tolist() == [ROWS] * 4
    assert w.free_count == 0 and sorted(w.slot_object[1:].tolist()) == mine.tolist()


def test_the_check_catches_pages_handed_out_highest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    def highest_first(self: PoolSlots, count: int) -> NDArray[np.int32]:
        top = self.space.count
        self.space.count = top - count
        return self.space.free[top - count:top].copy()

    monkeypatch.setattr(PoolSlots, "pop_slots", highest_first)
    assert list(lowest_first_problems(make()))


def test_guard_slot_available_reads_the_free_stacks() -> None:
    o = make()
    w, p = o.pools[WINDOW], o.pools[PREFIX]
    reserve(o, {WINDOW: 3})
    assert ObjectView(o, ids(w.base + 3), 0).slot_available()
    assert ObjectView(o, ids(w.base + 3, p.base, p.base + 1, p.base + 2, p.base + 3), 0).slot_available()
    assert not ObjectView(o, ids(w.base + 2, w.base + 3), 0).slot_available(), "two objects, one free page"
    w.space.count -= 1  # the stack is what the guard reads
    assert not ObjectView(o, ids(w.base + 3), 0).slot_available()
    w.space.count += 1
    reserve(o, {WINDOW: 1})
    assert not ObjectView(o, ids(w.base), 0).slot_available()
    assert ObjectView(o, ids(p.base), 0).slot_available()


@pytest.mark.parametrize("counts", [{WINDOW: 1}, {WINDOW: 1, PREFIX: 1}, {WINDOW: 2}])
def test_reserve_without_a_free_page_is_refused_and_takes_nothing(counts: dict[int, int]) -> None:
    o = make()
    reserve(o, {WINDOW: PAGES - 1 if counts[WINDOW] == 2 else PAGES})
    before = frozen(o)
    with pytest.raises(IllegalTransition) as err:
        reserve(o, counts)
    assert (err.value.event, err.value.guard) == ("reserve", "slot_available")
    assert frozen(o) == before, "a refused reservation takes nothing"


def test_a_reservation_that_fits_exactly_succeeds() -> None:
    o = make()
    got = reserve(o, {WINDOW: PAGES, PREFIX: PAGES})
    assert [len(g) for g in got[:2]] == [PAGES, PAGES] and o.pools[WINDOW].free_count == 0


# ---------------------------------------------------------------------------------------------- settle


def settle_scenario(o: PagePools) -> dict[str, list[str]]:
    """Published objects in every situation settle meets; their states after each round."""
    w, p = o.pools[WINDOW], o.pools[PREFIX]
    loose, held, leased, kv_leased = ids(w.base), ids(w.base + 1), ids(w.base + 2), ids(p.base)
    reserve(o, {WINDOW: 3, PREFIX: 1})
    publish(o, np.concatenate([loose, held]))
    publish(o, np.concatenate([leased, kv_leased]), pinned=True)
    o.step(held, Event.HOLD)
    everyone = np.concatenate([loose, held, leased, kv_leased])
    out = {"published": states(o, everyone)}
    o.settle(everyone)
    out["settled"] = states(o, everyone)
    o.step(np.concatenate([leased, kv_leased]), Event.UNPIN, 0)
    req = o.requests.by_slot[0]
    assert req is not None
    req.pins.clear()
    out["unpinned"] = states(o, everyone)
    o.settle(everyone)
    out["settled again"] = states(o, everyone)
    return out


def test_settle_evicts_retires_and_reclaims() -> None:
    o = make()
    w = o.pools[WINDOW]
    versions = o.version.copy()
    assert settle_scenario(o) == {
        "published": ["PUBLISHED"] * 4,
        # unheld and unpinned: evicted; held: stays; unheld but pinned: a window retires, a prefix page stays
        "settled": ["FREE", "PUBLISHED", "RETIRED", "PUBLISHED"],
        "unpinned": ["FREE", "PUBLISHED", "RETIRED", "PUBLISHED"],
        "settled again": ["FREE", "PUBLISHED", "FREE", "FREE"],  # reclaimed; the prefix page evicted
    }
    # pages 1, 2, 3 were placed in order: the evicted (1) and reclaimed (3) ones are free again, with 4
    assert o.slot[w.base + 1] == 2 and sorted(w.space.free[:w.free_slot_count].tolist()) == [1, 3, 4]
    gone = ids(w.base, w.base + 2, o.pools[PREFIX].base)
    assert np.all(o.version[gone] > versions[gone]) and o.version[w.base + 1] == versions[w.base + 1]
    assert np.all(o.slot[gone] == NULL_OBJECT) and o.leases.sum() == 0


def test_settle_on_nothing_loose_changes_nothing() -> None:
    o = make()
    w = o.pools[WINDOW]
    reserve(o, {WINDOW: 2})
    publish(o, ids(w.base))
    o.step(ids(w.base), Event.HOLD)
    before = frozen(o)
    o.settle(ids(w.base, w.base + 1))  # one held, one still private
    o.settle(np.zeros(0, np.intp))
    assert frozen(o) == before


def test_a_settle_that_ignores_pins_is_refused_by_the_lifecycle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: evict whatever is unheld; guard `unpinned` refuses before anything changes."""
    def careless(self: PagePools, objs: NDArray[np.intp]) -> None:
        loose = (self.holders[objs] == 0) & self.published[self.code[objs]]
        self.step(objs[loose], Event.EVICT)

    o = make()
    w = o.pools[WINDOW]
    reserve(o, {WINDOW: 2})
    publish(o, ids(w.base, w.base + 1), pinned=True)
    before = frozen(o)
    monkeypatch.setattr(PagePools, "settle", careless)
    with pytest.raises(IllegalTransition) as err:
        o.settle(ids(w.base, w.base + 1))
    assert (err.value.event, err.value.guard) == ("evict", "unpinned") and frozen(o) == before


def test_a_settle_that_never_reclaims_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: retired objects are never reclaimed, so their pages leak."""
    real = PagePools.step

    def no_reclaim(self: PagePools, objs: NDArray[np.intp], event: Event, *args: Any, **kwargs: Any) -> None:
        if event is not Event.RECLAIM:
            real(self, objs, event, *args, **kwargs)

    monkeypatch.setattr(PagePools, "step", no_reclaim)
    assert settle_scenario(make())["settled again"] != ["FREE", "PUBLISHED", "FREE", "FREE"]


# ---------------------------------------------------------------------------------------------- versions


def version_problems(o: PagePools, rounds: int = 30) -> list[str]:
    """Reserve, publish, evict and abort over and over; every stamp must be new."""
    rng = np.random.default_rng(0)
    seen: set[tuple[int, int, int]] = set()  # (pool, page, version) of every placement
    problems = []
    for _ in range(rounds):
        counts = {WINDOW: int(rng.integers(1, PAGES + 1)), PREFIX: int(rng.integers(0, PAGES + 1))}
        got = np.concatenate(reserve(o, counts))
        for b in got.tolist():
            placement = (int(o.pool[b]), int(o.slot[b]), int(o.version[b]))
            if placement in seen:
                problems.append(f"page {placement[:2]} saw version {placement[2]} twice")
            seen.add(placement)
        if np.unique(o.version).size != o.version.size:
            problems.append("two objects share a version")
        keep = rng.random(len(got)) < 0.5
        o.step(got[~keep], Event.ABORT, 0)
        publish(o, got[keep])
        o.settle(got[keep])  # unheld and unpinned: evicted
        if not np.all(o.codes.initial[o.code[got]]):
            problems.append("objects did not return to FREE")
    return problems


def test_versions_are_unique_stamps_over_the_pools_life() -> None:
    o = make()
    assert o.version.tolist() == list(range(o.version.size)), "object i starts at version i"
    assert version_problems(o) == []
    assert o.clock > o.version.max(), "the clock is ahead of every stamp handed out"


def test_the_check_catches_versions_bumped_per_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: the old per-object counter (version + 1) repeats stamps across objects and pages."""
    def plus_one(self: PagePools, objs: NDArray[np.intp]) -> None:
        self.version[objs] += 1

    monkeypatch.setattr(PagePools, "bump", plus_one)
    assert version_problems(make())


# ---------------------------------------------------------------------------------------------- refused bulk steps


def test_a_refused_multi_state_step_changes_nothing() -> None:
    o = make()
    w, p = o.pools[WINDOW], o.pools[PREFIX]
    reserve(o, {WINDOW: 2, PREFIX: 2}, actor=0)
    other = reserve(o, {WINDOW: 1}, actor=1)[WINDOW]
    o.requests.committed[0] = ROWS
    ready = ids(p.base + 1)
    o.step(ready, Event.SEAL, 0)  # RESERVED -> READY (prefix pages seal)
    assert states(o, ids(w.base, p.base, p.base + 1)) == ["RESERVED", "RESERVED", "READY"]
    before = frozen(o)
    # RESERVED and READY objects of two kinds, one owned by another request: the owner guard refuses
    with pytest.raises(IllegalTransition) as err:
        o.step(np.concatenate([ids(w.base, p.base, p.base + 1), other]), Event.ABORT, 0)
    assert (err.value.event, err.value.guard, err.value.state) == ("abort", "is_owner", "RESERVED")
    assert frozen(o) == before
    # one object has no such transition at all
    publish(o, ids(w.base + 1))
    before = frozen(o)
    with pytest.raises(IllegalTransition) as err:
        o.step(ids(w.base, w.base + 1, p.base + 1), Event.ABORT, 0)
    assert (err.value.state, err.value.guard) == ("PUBLISHED", None) and frozen(o) == before


def filling(o: PagePools, pool: int, actor: int) -> NDArray[np.intp]:
    objs = reserve(o, {pool: 2}, actor)[pool]
    o.step(objs, Event.FILL, actor)
    return objs


def test_a_refused_step_over_several_kinds_changes_nothing() -> None:
    """copy_done moves FILLING objects of two kinds (and a RESERVED one it has no edge for)."""
    o = make()
    fills = np.concatenate([filling(o, WINDOW, 0), filling(o, PREFIX, 0)])
    stray = reserve(o, {WINDOW: 1})[WINDOW]
    assert states(o, fills) == ["FILLING"] * 4 and o.copies[fills].tolist() == [1] * 4
    before = frozen(o)
    with pytest.raises(IllegalTransition) as err:
        o.step(np.concatenate([fills, stray]), Event.COPY_DONE)
    assert (err.value.state, err.value.event) == ("RESERVED", "copy_done") and frozen(o) == before
    o.step(fills, Event.COPY_DONE)
    assert states(o, fills) == ["RESERVED"] * 4 and o.copies[fills].tolist() == [0] * 4


@pytest.fixture()
def guarded_copy_done(tmp_path: Path) -> LifecycleSpec:
    """The shipped spec with copy_done out of FILLING also guarded by is_owner for compressed_kv only (its first
    kind): FILLING windows and prefix pages then move by different guards, so the step runs per group."""
    old = '{ source = "FILLING", event = "copy_done", dest = "RESERVED", guards = ["no_load_in_flight"]'
    spec = load_lifecycle(mutated_spec(tmp_path, old, old.replace('guards = ["no_load_in_flight"]',
                                                                  'guards = ["no_load_in_flight", "is_owner"]')))
    guarded = [t.guards for t in spec.kind("compressed_kv").transitions if t.event == "copy_done"]
    assert ("no_load_in_flight", "is_owner") in guarded, guarded
    return spec


def refused_second_group(spec: LifecycleSpec) -> tuple[bool, bool]:
    """copy_done over two groups (windows of request 0, prefix pages of request 1), request 0 acting:
    (was it refused, did anything change)."""
    o = make(spec)
    mine, theirs = filling(o, WINDOW, 0), filling(o, PREFIX, 1)
    before = frozen(o)
    try:
        o.step(np.concatenate([mine, theirs]), Event.COPY_DONE, 0)
    except IllegalTransition as err:
        assert (err.guard, err.kind) == ("is_owner", "compressed_kv")
        return True, frozen(o) != before
    return False, True


def test_a_guard_refusing_a_later_group_changes_nothing(guarded_copy_done: LifecycleSpec) -> None:
    assert refused_second_group(guarded_copy_done) == (True, False)


def test_the_check_catches_groups_applied_as_they_pass(guarded_copy_done: LifecycleSpec,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: each group's guards are checked right before its effects, not all groups first."""
    from hkv_core.spec.guards import first_refusing

    def eager(self: PagePools, objs: NDArray[np.intp], codes: NDArray[np.uint8], rule: Any, actor: int,
              counts: NDArray[np.intp] | None) -> None:
        for c in np.flatnonzero(np.bincount(codes)).tolist():
            mask, edge = codes == c, rule.edges[c]
            refused = first_refusing(edge.guards, edge.guard_names, ObjectView(self, objs[mask], actor))
            if refused is not None:
                raise IllegalTransition(kind=self.codes.describe(c)[0], state=self.codes.describe(c)[1],
                                        event=rule.event.value, guard=refused)
            for name in edge.effects:
                object_effects.EFFECTS[name](self, objs[mask], actor, None)
            self.code[objs[mask]] = int(rule.dest[c])

    monkeypatch.setattr(PagePools, "_step_groups", eager)
    assert refused_second_group(guarded_copy_done) == (True, True)


def test_invariants_catch_a_retired_object_left_unreclaimed() -> None:
    from hkv_core.layout import Layout
    from hkv_core.manager import CacheManager, check_invariants

    m = CacheManager(Layout.from_preset("tiny_v4"), ManagerConfig(default_pool_pages=PAGES, key_seed=0))
    req = m.core.requests.by_rid[m.add_request(np.arange(20))]
    o = m.core.objects
    obj = reserve(o, {WINDOW: 1}, actor=req.slot)[WINDOW]
    m.core.requests.committed[req.slot] = ROWS
    o.step(obj, Event.PUBLISH_PINNED, req.slot)
    req.pins.add(obj, o.version[obj])
    o.settle(obj)
    assert states(o, obj) == ["RETIRED"] and check_invariants(m) == []
    o.step(obj, Event.UNPIN, req.slot)  # the last pin goes, but nobody settles: a missed reclaim
    req.pins.clear()
    assert states(o, obj) == ["RETIRED"] and o.leases[obj].tolist() == [0]
    assert any(v.startswith("no_slot_leak") for v in check_invariants(m))
