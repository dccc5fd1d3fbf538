"""The implementation-level model check drives public-API clones of a real CacheManager and can fail.

Four broken managers, each caught: a release that leaves its pins behind, an
eviction that ignores pins, a failed call with a side effect, and a manager
that never reclaims retired window pages.  The default bound is also shown to
reach the lifecycle's steps that matter (retire, reclaim, seal, failed copies).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
import pytest
from numpy.typing import NDArray

from hkv_core.checker.impl import ImplCheckConfig, check_implementation
from hkv_core.manager import allocate, evict
from hkv_core.manager import release as release_verb
from hkv_core.manager.core import Core
from hkv_core.manager.page_pools import PagePools, SlotSpace
from hkv_core.manager.requests import RequestState
from hkv_core.manager.roles import Moves, PrefixRole, Role, TailRole, WindowRole
from hkv_core.spec.names import Event

SMALL = ImplCheckConfig(max_depth=5)


# On tiny_csa a compressed-KV page holds exactly one block, so no hit ends inside one: no seal or partial
# publish of compressed KV is possible there (the scenarios and the state machine cover them on layouts that
# have them).  Its fill and copy steps are reached by tier loads.
UNREACHABLE_ON_TINY_CSA = {"compressed_kv.publish", "compressed_kv.seal"}
TIER_LOAD_STEPS = {f"{kind}.{event}" for kind in ("compressed_kv", "compressor_tail", "swa_window", "indexer_state")
                   for event in ("fill", "copy_done", "copy_fail")} | {"tier_load.load", "tier_load.copy_done",
                                                                       "tier_load.copy_fail"}
MUST_REACH = {"swa_window.retire", "swa_window.reclaim", "indexer_state.seal", "indexer_state.publish",
              "compressor_tail.copy_done", "compressor_tail.copy_fail", "resume_point.keep", "resume_point.drop",
              "block.index", "block.attach", "block.drop", "swa_window.evict", "compressed_kv.evict",
              *(f"{kind}.{event}" for kind in ("compressed_kv", "compressor_tail", "swa_window", "indexer_state")
                for event in ("reserve_draft", "accept", "reject")), *TIER_LOAD_STEPS}


def test_default_bound_explores_10000_states_cleanly_and_reaches_every_reachable_step() -> None:
    result = check_implementation()
    assert result.states_explored >= 10_000
    assert result.calls_explored > result.states_explored
    assert result.failed_calls > 0, "the bound must reach failing calls (full pools, stale leases)"
    assert result.invariants_checked >= result.states_explored * 10
    assert result.violations == ()
    assert set(result.transitions_taken) >= MUST_REACH, sorted(MUST_REACH - set(result.transitions_taken))
    assert set(result.transitions_missed) == UNREACHABLE_ON_TINY_CSA


def test_a_manager_that_never_reclaims_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: settle forgets RECLAIM, so a retired window page keeps its page after its last pin."""
    one_request = ImplCheckConfig(max_requests=1)  # reaches reclaim in about 2,600 states
    assert "swa_window.reclaim" in check_implementation(one_request).transitions_taken
    real = PagePools.step

    def no_reclaim(self: PagePools, objs: NDArray[np.intp], event: Event, *args: Any, **kwargs: Any) -> None:
        if event is not Event.RECLAIM:
            real(self, objs, event, *args, **kwargs)

    monkeypatch.setattr(PagePools, "step", no_reclaim)
    found = dict(check_implementation(attrs.evolve(one_request, stop_on_violation=True)).violations)
    assert "no_slot_leak" in found, sorted(found)
    assert "RETIRED" in found["no_slot_leak"][-1]


def test_release_that_leaves_its_pins_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: release forgets the unpin step (it still clears the lease list and settles)."""
    real = release_verb.release

    def forgetful(core: Core, req: RequestState) -> None:
        step = core.objects.step

        def no_unpin(objs: NDArray[np.intp], event: Event, *args: Any, **kwargs: Any) -> None:
            if event is not Event.UNPIN:
                step(objs, event, *args, **kwargs)

        core.objects.step = no_unpin  # type: ignore[method-assign]
        try:
            real(core, req)
        finally:
            del core.objects.step

    monkeypatch.setattr(release_verb, "release", forgetful)
    found = dict(check_implementation(attrs.evolve(SMALL, stop_on_violation=True)).violations)
    assert "refcount_matches_leases" in found, sorted(found)
    assert any("release" in step for step in found["refcount_matches_leases"][:-1])


def never_pinned(self: Role, units: NDArray[np.int32]) -> NDArray[np.bool_]:
    return np.zeros(len(units), np.bool_)


def test_a_planner_blind_to_pins_stays_safe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The eviction planner told nothing is pinned (prefix pages, tail snapshots) drops more index entries,
    but pinned objects survive: settle re-checks every lease before it frees anything."""
    monkeypatch.setattr(PrefixRole, "blocks_pinned", never_pinned)
    monkeypatch.setattr(TailRole, "points_pinned", never_pinned)
    result = check_implementation(SMALL)
    assert result.violations == () and result.states_explored >= 2_000


def test_eviction_that_frees_pinned_objects_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: the planner ignores pins and the eviction evicts every object it unreferenced,
    pinned or not.  The lifecycle refuses (guard `unpinned`) half-way through the eviction, after index
    entries were dropped: the checker reports the half-done call with its trace."""
    monkeypatch.setattr(PrefixRole, "blocks_pinned", never_pinned)
    monkeypatch.setattr(TailRole, "points_pinned", never_pinned)
    real = evict._apply

    def careless_apply(core: Core, walk: Any, cut: int | None, max_units: int | None, **options: Any) -> int:
        settle = core.objects.settle

        def careless(objs: NDArray[np.intp]) -> None:
            o = core.objects
            loose = (o.holders[objs] == 0) & o.published[o.code[objs]]
            o.step(objs[loose], Event.EVICT)  # no lease check
            settle(objs[~loose])

        core.objects.settle = careless  # type: ignore[method-assign]
        try:
            return real(core, walk, cut, max_units, **options)
        finally:
            del core.objects.settle

    monkeypatch.setattr(evict, "_apply", careless_apply)
    found = dict(check_implementation(attrs.evolve(SMALL, stop_on_violation=True)).violations)
    assert "failed_call_changed_state" in found, sorted(found)
    assert found["failed_call_changed_state"][-1].startswith("evict(")


def test_failed_call_that_changes_state_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: allocate changes the request before it finds out the pools are short (OutOfPages)."""
    real: Callable[..., Any] = allocate.needs

    def leaky(core: Core, req: RequestState, start: int, end: int) -> Any:
        found = real(core, req, start, end)
        req.tokens = np.concatenate([req.tokens, [0]])  # a side effect before OutOfPages
        return found

    monkeypatch.setattr(allocate, "needs", leaky)
    found = dict(check_implementation(SMALL).violations)  # the first violation reached is another one
    assert "failed_call_changed_state" in found
    assert found["failed_call_changed_state"][-1].startswith("allocate(")


def test_the_pools_refuse_a_pinned_eviction_on_their_own() -> None:
    """What variant (b) runs into: an evict step over a leased object is refused (guard `unpinned`)."""
    from hkv_core.errors import IllegalTransition
    from hkv_core.layout import Layout
    from hkv_core.manager import CacheManager, ManagerConfig

    m = CacheManager(Layout.from_preset("tiny_csa"), ManagerConfig(default_pool_pages=6, key_seed=7))
    prompt = np.arange(1, 20) % 60
    a = m.add_request(prompt)
    m.allocate(a, 16)
    m.commit(a, 16)
    pools: PagePools = m.core.objects
    leased = np.flatnonzero(pools.leases > 0)
    assert leased.size, "a request pins the pages it published and still reads"
    with pytest.raises(IllegalTransition, match="unpinned"):
        pools.step(leased[:1], Event.EVICT)


AHEAD_STEPS = {f"{kind}.{event}" for kind in ("compressed_kv", "compressor_tail", "swa_window", "indexer_state")
               for event in ("reserve_ahead", "verify")}


def test_a_clean_manager_reserves_ahead_verifies_and_refuses_failed_calls_unchanged() -> None:
    """The same bound as the broken variants, unbroken: no violation, some failed calls (each left the manager
    as it was).  allocate_ahead, the append_tokens that makes its positions known and the commits after it are
    explored on every device kind; commits past the known tokens are tried and refused with nothing changed.
    (One run for both claims: SMALL costs ~25 s.)"""
    result = check_implementation(SMALL)
    assert result.violations == () and result.failed_calls > 0
    assert set(result.transitions_taken) >= AHEAD_STEPS, sorted(AHEAD_STEPS - set(result.transitions_taken))


def test_a_commit_past_the_known_tokens_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: commit bounded by the allocated tokens, not the known ones (the manager before
    allocate_ahead), so slots reserved ahead get committed before their tokens are known.  With 2 positions
    reserved ahead the commit past known stays inside a block (no key, block or point is due, nothing is
    published yet): it goes through, and `ahead_never_published` names the request in that state.  (A
    commit that reached an AHEAD page would be refused by the lifecycle table: no publish edge leaves AHEAD.)"""
    from hkv_core.manager.manager import CacheManager

    real = CacheManager._count

    def loose(self: CacheManager, req: RequestState, action: str, value: object, room: int) -> int:
        if action == "commit":
            room = req.allocated - req.computed
        return real(self, req, action, value, room)

    monkeypatch.setattr(CacheManager, "_count", loose)
    found = dict(check_implementation(attrs.evolve(SMALL, ahead_tokens=2, stop_on_violation=True)).violations)
    assert "ahead_never_published" in found, sorted(found)
    assert any(step.startswith("commit(") and "past known" in step for step in found["ahead_never_published"])


def test_append_that_never_verifies_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: append_tokens makes slots reserved ahead known but never verifies them (they stay
    AHEAD, so the commit after it could never publish them): `ahead_never_published` catches it."""
    from hkv_core.manager import admit

    monkeypatch.setattr(admit, "verify_known", lambda core, req: None)
    found = dict(check_implementation(attrs.evolve(SMALL, stop_on_violation=True)).violations)
    assert "ahead_never_published" in found, sorted(found)
    assert any(step.startswith("append(") for step in found["ahead_never_published"])


def _load_without_fill(monkeypatch: pytest.MonkeyPatch) -> None:
    """plan_load issues its plan without firing `fill`: the pages a copy is still writing stay RESERVED."""
    from hkv_core.manager import record_plans

    real = PagePools.step

    def no_fill(self: PagePools, objs: NDArray[np.intp], event: Event, *args: Any, **kwargs: Any) -> None:
        if event is not Event.FILL or not getattr(no_fill, "loading", False):
            real(self, objs, event, *args, **kwargs)

    real_issue = record_plans.issue_load

    def issue_without_fill(*args: Any, **kwargs: Any) -> Any:
        no_fill.loading = True  # type: ignore[attr-defined]
        try:
            return real_issue(*args, **kwargs)
        finally:
            no_fill.loading = False  # type: ignore[attr-defined]

    monkeypatch.setattr(PagePools, "step", no_fill)
    monkeypatch.setattr(record_plans, "issue_load", issue_without_fill)


def test_a_tier_load_into_unpinned_pages_is_refused_by_its_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `fill` skipped, the record's `load` meets guard `targets_filling` and is refused, nothing changed:
    no load runs into pages a commit could publish."""
    _load_without_fill(monkeypatch)
    result = check_implementation(attrs.evolve(SMALL, max_depth=4))
    assert result.violations == ()
    assert "tier_load.load" not in result.transitions_taken


def test_a_tier_load_that_does_not_pin_its_targets_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: plan_load skips `fill` and the guard `targets_filling` is gone, so the pages a copy is
    still writing stay RESERVED (commit could publish them before the copy completed)."""
    from hkv_core.manager.tier_loads import LoadView

    _load_without_fill(monkeypatch)
    monkeypatch.setattr(LoadView, "targets_filling", lambda self: True)
    found = dict(check_implementation(attrs.evolve(SMALL, max_depth=4, stop_on_violation=True)).violations)
    assert {"copy_endpoints_pinned", "tier_loads_pinned"} & set(found), sorted(found)
    assert any("tier_load" in step for trace in found.values() for step in trace)


def test_targets_that_settle_before_their_load_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: complete settles a load plan's targets but leaves its tier loads LOADING, and the
    targets' guard `no_load_in_flight` is gone: the pages leave FILLING (and may be published) while the
    load still writes them."""
    from hkv_core.manager.object_view import ObjectView
    from hkv_core.manager.tier_loads import TierLoads

    monkeypatch.setattr(TierLoads, "settle", lambda self, plan_id, ok: None)
    monkeypatch.setattr(ObjectView, "loads_in_flight", lambda self: np.zeros(len(self.objs), np.int32))
    found = dict(check_implementation(attrs.evolve(SMALL, max_depth=4, stop_on_violation=True)).violations)
    assert "tier_loads_pinned" in found, sorted(found)
    assert found["tier_loads_pinned"][-2].startswith("complete(")


def test_targets_settling_before_their_load_are_refused_by_their_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the loads left LOADING, the targets' `copy_done` meets guard `no_load_in_flight` and is refused:
    the broken complete is then a call that changed state and failed, which the checker reports."""
    from hkv_core.manager.tier_loads import TierLoads

    monkeypatch.setattr(TierLoads, "settle", lambda self, plan_id, ok: None)
    found = dict(check_implementation(attrs.evolve(SMALL, max_depth=4, stop_on_violation=True)).violations)
    assert "failed_call_changed_state" in found, sorted(found)


# ----------------------------------------------------------- one block space shared by every pool

SHARED = ImplCheckConfig(shared_pages=20, max_depth=5)


def test_the_shared_block_space_is_explored_cleanly_and_reaches_every_reachable_step() -> None:
    """tiny_csa's five pools drawing their pages from one space of 20 (as vLLM's groups share one block pool):
    eviction frees blocks for whichever pool needs them, and every step reached with static pools is reached."""
    result = check_implementation(attrs.evolve(SHARED, max_depth=6))
    assert result.violations == () and result.states_explored >= 10_000
    assert set(result.transitions_missed) == UNREACHABLE_ON_TINY_CSA
    assert result.failed_calls > 0  # a full space refuses an allocation, changing nothing


def test_a_space_that_hands_one_block_to_two_pools_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: the shared space gives out its lowest free block without taking it off the free list,
    so the next reservation, of another pool, is handed the same block."""
    def pop_without_taking(self: SlotSpace, count: int) -> NDArray[np.int32]:
        return self.free[self.count - count:self.count][::-1].copy()

    monkeypatch.setattr(SlotSpace, "pop", pop_without_taking)
    found = dict(check_implementation(attrs.evolve(SHARED, stop_on_violation=True)).violations)
    assert "blocks_exclusive" in found, sorted(found)


def test_a_slide_that_frees_a_kept_points_block_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: the window slide gives back to the space the blocks of pages a kept resume point
    still holds (it only unpins them), so the next pool to reserve overwrites what a hit would read."""
    real = WindowRole.slide

    def slide(self: WindowRole, req: RequestState, pending: list[int], moves: Moves) -> None:
        real(self, req, pending, moves)
        for objs in moves.objs.get(Event.UNPIN, []):
            held = objs[self.objects.holders[objs] > 0]
            if held.size:
                self.pools[0].push_slots(self.objects.slot[held])

    monkeypatch.setattr(WindowRole, "slide", slide)
    found = dict(check_implementation(attrs.evolve(SHARED, stop_on_violation=True)).violations)
    assert "freed_blocks_unreachable" in found, sorted(found)
