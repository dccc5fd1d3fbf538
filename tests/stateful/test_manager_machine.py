"""Bind hkv_core.testing.manager_machine to preset layouts, and prove the machine can fail.

Example counts scale with the hypothesis profile (ci: 500 in all, weighted
toward the cheaper layouts; deep: 12,500).
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, Hit, InvalidRequestState, ManagerConfig, StaleLease, check_invariants, evict
from hkv_core.testing.manager_machine import ManagerMachine, make_manager_machine

STEPS = 30
BASE_EXAMPLES = settings().max_examples  # of the loaded profile


def bind(machine: type[ManagerMachine], share: float) -> type:
    case = machine.TestCase
    case.settings = settings(max_examples=max(1, round(BASE_EXAMPLES * share)), stateful_step_count=STEPS)
    return case


TinyRetainEvery1 = make_manager_machine("tiny_v4", default_pool_pages=48, retain_every_blocks=1)
TinyRetainEvery2 = make_manager_machine("tiny_v4", default_pool_pages=24, retain_every_blocks=2, max_requests=4)
Flash16 = make_manager_machine("deepseek_v4_flash", block_tokens=16, default_pool_pages=128, retain_every_blocks=4)
LlamaFull = make_manager_machine("llama_full", default_pool_pages=32)

TestTinyRetainEvery1 = bind(TinyRetainEvery1, 0.6)
TestTinyRetainEvery2 = bind(TinyRetainEvery2, 0.5)
TestFlash16 = bind(Flash16, 0.4)
TestLlamaFull = bind(LlamaFull, 1.0)


# ----------------------------------------------------------- the machine can fail

class ReleaseForgetsToUnpin(ManagerMachine):
    def make_manager(self) -> CacheManager:
        manager = super().make_manager()
        core = manager.core

        def release(rid: int) -> None:  # forgets the request but keeps its pins and pages
            del core.requests[rid]

        manager.release = release  # type: ignore[method-assign]
        return manager


class CommitSkipsPublishing(ManagerMachine):
    def make_manager(self) -> CacheManager:
        manager = super().make_manager()
        core = manager.core

        def commit(rid: int, num_tokens: int) -> None:  # counts the tokens, publishes nothing
            req = core.requests[rid]
            if num_tokens < 1 or req.computed + num_tokens > req.allocated:
                raise InvalidRequestState(request_id=rid, action="commit", reason="beyond allocated")
            req.computed += num_tokens

        manager.commit = commit  # type: ignore[method-assign]
        return manager


class AcquireSkipsVersionCheck(ManagerMachine):
    def make_manager(self) -> CacheManager:
        manager = super().make_manager()
        core, acquire = manager.core, manager.acquire

        def unchecked(rid: int, found: Hit) -> None:  # re-reads the versions instead of checking them (F3)
            now = {n: core.pools[core.pool_index[n]].version[p].copy() for n, p in found.pages.items()}
            acquire(rid, attrs.evolve(found, versions=now))

        manager.acquire = unchecked  # type: ignore[method-assign]
        return manager


@pytest.mark.parametrize(("broken", "symptom"), [
    (ReleaseForgetsToUnpin, "still owns pages|invariant violated"),
    (CommitSkipsPublishing, "committed since the last eviction"),
    (AcquireSkipsVersionCheck, "moved|version|illegal transition"),
])
def test_machine_finds_a_broken_manager(broken: type[ManagerMachine], symptom: str) -> None:
    quick = settings(max_examples=500, stateful_step_count=STEPS, database=None, phases=[Phase.generate],
                     report_multiple_bugs=False, print_blob=False)
    with pytest.raises(Exception, match=symptom):
        run_state_machine_as_test(broken, settings=quick)


# ------------------------------------------------------- regression examples

def test_failed_allocate_leaves_request_matchable() -> None:
    """A refused allocate on a request that never acquired does not mark it acquired."""
    m = CacheManager(Layout.from_preset("tiny_v4"), ManagerConfig(default_pool_pages=8, seed=0))
    rid = m.add_request(np.arange(40))
    with pytest.raises(InvalidRequestState):
        m.allocate(rid, 41)
    assert m.match(rid).tokens == 0


def _evict_under_a_found_chain(m: CacheManager) -> tuple[np.ndarray, int]:
    """b computed block 0 itself and found it indexed (its chain names it, unpinned), then evict() ran."""
    prompt = np.arange(3 * m.layout.block_tokens)
    a = m.add_request(prompt)
    m.allocate(a, 32)
    m.commit(a, 32)
    m.release(a)  # blocks 0 and 1 indexed, nothing pinned
    b = m.add_request(prompt)
    m.allocate(b, 16)
    m.commit(b, 16)
    m.evict()  # block 1 goes; block 0 ends b's chain and stays
    return prompt, b


def test_commit_after_its_found_blocks_were_evicted() -> None:
    m = CacheManager(Layout.from_preset("llama_full"), ManagerConfig(default_pool_pages=16, seed=0))
    prompt, b = _evict_under_a_found_chain(m)
    m.allocate(b, 16)
    m.commit(b, 16)  # block 1 is indexed again under block 0
    assert check_invariants(m) == []
    assert m.match(m.add_request(prompt)).tokens == 32  # b committed [0, 32)
    m.release(b)
    assert m.evict() == 2 and m.core.arena.live == 0


def test_invariants_catch_a_chain_evicted_under_a_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: eviction no longer keeps live chains; check_invariants must say so."""
    monkeypatch.setattr(evict, "live_chain_tails", lambda core: set())
    m = CacheManager(Layout.from_preset("llama_full"), ManagerConfig(default_pool_pages=16, seed=0))
    _evict_under_a_found_chain(m)
    broken = check_invariants(m)
    assert any("lease_covers_object_set" in v and "not indexed under its keys" in v for v in broken), broken


def _point_without_pins(m: CacheManager, prompt: np.ndarray, tokens: int) -> None:
    """Blocks [0, tokens) indexed by a released request, kept by a live one's child, their points evicted."""
    x = m.add_request(prompt)
    m.allocate(x, tokens)
    m.commit(x, tokens)
    c = m.add_request(prompt)
    m.allocate(c, tokens + m.layout.block_tokens)
    m.commit(c, tokens + m.layout.block_tokens)  # finds x's blocks, adds one of its own (pinned)
    m.release(x)
    assert m.evict() > 0  # x's points go; its blocks stay under c's pinned child


def test_stale_lease_names_the_state_that_moved() -> None:
    """A window page retired from the index while its publisher still pins it keeps its version: the
    StaleLease says the state moved."""
    m = CacheManager(Layout.from_preset("tiny_v4"), ManagerConfig(default_pool_pages=32, retain_every_blocks=1, seed=0))
    prompt = np.arange(40)
    _point_without_pins(m, prompt, 16)
    a = m.add_request(prompt)
    m.allocate(a, 16)
    m.commit(a, 16)  # a records the points at 8 and 16 again, publishing and pinning its own window pages
    b = m.add_request(prompt[:17])
    hit = m.match(b)
    assert hit.tokens == 16
    m.evict()  # the point at 16 goes: a's window page of block 1 is retired, a still pins it
    with pytest.raises(StaleLease) as stale:
        m.acquire(b, hit)
    err = stale.value
    assert (err.found_version, err.found_state, err.expected_state) == (err.expected_version, "RETIRED", "PUBLISHED")
    assert "state RETIRED" in str(err) and err.fields["found_state"] == "RETIRED"


def test_new_point_never_indexes_a_retired_window_page() -> None:
    m = CacheManager(Layout.from_preset("deepseek_v4_flash", block_tokens=16),
                     ManagerConfig(default_pool_pages=64, retain_every_blocks=4, seed=0))
    prompt = np.arange(200)
    _point_without_pins(m, prompt, 64)
    b = m.add_request(prompt)
    m.allocate(b, 64)
    m.commit(b, 64)  # b records the point at 64 again, publishing and pinning its own window pages
    assert m.evict(max_units=1) == 1  # that point goes again: b's window pages are retired, b still pins them
    m.allocate(b, 64)
    m.commit(b, 64)  # the point at 128 needs window blocks 0-7, among them b's retired pages
    assert check_invariants(m) == []
    assert m.match(m.add_request(prompt)).tokens < 128  # so it was not recorded


def test_acquire_refuses_a_hit_whose_block_left_the_index() -> None:
    """Defence in depth: pages shared with earlier blocks could keep their versions when a hit's last block goes
    (no preset reaches it: tails or per-block pages always move first), so acquire also checks the blocks."""
    m = CacheManager(Layout.from_preset("llama_full"), ManagerConfig(default_pool_pages=16, seed=0))
    prompt = np.arange(3 * m.layout.block_tokens)
    a = m.add_request(prompt)
    m.allocate(a, 48)
    m.commit(a, 48)
    m.release(a)
    b = m.add_request(prompt)
    hit = m.match(b)
    last = int(hit.block_ids[-1])
    m.core.arena.alive[last] = False  # as if dropped while its page stayed published
    with pytest.raises(StaleLease) as err:
        m.acquire(b, hit)
    assert (err.value.pool, err.value.page, err.value.found_state) == ("block index", last, "EVICTED")
    assert m.core.requests[b].chain == [] and not any(m.core.requests[b].pinned_versions)
