"""Bind hkv_core.testing.manager_machine to preset layouts, and prove the machine can fail.

Example counts scale with the hypothesis profile (ci: 500 in all, weighted
toward the cheaper layouts; deep: 12,500).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test
from numpy.typing import NDArray

from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, InvalidRequestState, ManagerConfig, StaleLease, check_invariants
from hkv_core.manager import acquire as acquire_module
from hkv_core.manager import evict as evict_module
from hkv_core.manager import match as match_module
from hkv_core.manager import release as release_module
from hkv_core.manager.core import Core
from hkv_core.manager.records import Hit
from hkv_core.manager.requests import RequestState, RequestTable
from hkv_core.manager.roles.prefix import PrefixRole
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
SwaFull = make_manager_machine("swa_full", default_pool_pages=64, retain_every_blocks=2)
TinyLinear = make_manager_machine("tiny_linear", default_pool_pages=32, retain_every_blocks=1)  # recurrent state
# DeepSeek-V4 as vLLM lays it out, shrunk: window pages of two blocks, hits on the LCM of the pages
V4InVllm = make_manager_machine("engine:v4_in_vllm", default_pool_pages=64, retain_every_blocks=1,
                                allow_partial_page_copy=False)
# ... its five groups drawing pages from one shared block space, as vLLM's groups share one block pool
V4InVllmShared = make_manager_machine("engine:v4_in_vllm:pool_per_group", shared_pages=48, retain_every_blocks=1,
                                      allow_partial_page_copy=False)
TinySharedSpace = make_manager_machine("tiny_v4", shared_pages=64, retain_every_blocks=1)
# DeepSeek-V4.1 without bounded replay, shrunk: windows, MLA, and the compressor's ring (a scratch page each)
V41InVllmShared = make_manager_machine("engine:v41_in_vllm:pool_per_group", shared_pages=48, retain_every_blocks=1,
                                       allow_partial_page_copy=False)

TestTinyRetainEvery1 = bind(TinyRetainEvery1, 0.5)
TestTinyRetainEvery2 = bind(TinyRetainEvery2, 0.4)
TestFlash16 = bind(Flash16, 0.3)
TestLlamaFull = bind(LlamaFull, 0.8)
TestSwaFull = bind(SwaFull, 0.5)
TestTinyLinear = bind(TinyLinear, 0.5)
TestV4InVllm = bind(V4InVllm, 0.3)
TestV4InVllmShared = bind(V4InVllmShared, 0.3)
TestTinySharedSpace = bind(TinySharedSpace, 0.3)
TestV41InVllmShared = bind(V41InVllmShared, 0.3)


# ----------------------------------------------------------- the machine can fail

Patch = Callable[[pytest.MonkeyPatch], None]


def release_keeps_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    """release forgets the request's lease list before unpinning: its pins stay on the pages."""
    original = release_module.release

    def release(core: Core, req: RequestState) -> None:
        req.pins.clear()
        original(core, req)

    monkeypatch.setattr(release_module, "release", release)


def commit_publishes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """commit counts the tokens but publishes no completed prefix page (and attaches none to its blocks)."""
    monkeypatch.setattr(PrefixRole, "completed", lambda self, req, before, moves: None)


def acquire_skips_version_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """acquire pins whatever the index holds now instead of checking the hit against it (F3)."""

    def verify(core: Core, req: RequestState, hit: Hit) -> list[NDArray[np.intp]]:
        return match_module.hit_objects(core, hit.block_ids, match_module.point_of(core, hit.block_ids))

    monkeypatch.setattr(acquire_module, "verify", verify)


@pytest.mark.parametrize(("broken", "symptom"), [
    (release_keeps_pins, "still owns pages|invariant violated|pins or owners left"),
    (commit_publishes_nothing, "committed since the last eviction"),
    (acquire_skips_version_check, "moved|version|illegal transition"),
])
def test_machine_finds_a_broken_manager(broken: Patch, symptom: str, monkeypatch: pytest.MonkeyPatch) -> None:
    quick = settings(max_examples=500, stateful_step_count=STEPS, database=None, phases=[Phase.generate],
                     report_multiple_bugs=False, print_blob=False, derandomize=True)  # the same search every run
    broken(monkeypatch)
    with pytest.raises(Exception, match=symptom):
        run_state_machine_as_test(ManagerMachine, settings=quick)


# ------------------------------------------------------- regression examples

def test_failed_allocate_leaves_request_matchable() -> None:
    """A refused allocate on a request that never acquired does not mark it acquired."""
    m = CacheManager(Layout.from_preset("tiny_v4"), ManagerConfig(default_pool_pages=8, key_seed=0))
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
    m = CacheManager(Layout.from_preset("llama_full"), ManagerConfig(default_pool_pages=16, key_seed=0))
    prompt, b = _evict_under_a_found_chain(m)
    m.allocate(b, 16)
    m.commit(b, 16)  # block 1 is indexed again under block 0
    assert check_invariants(m) == []
    assert m.match(m.add_request(prompt)).tokens == 32  # b committed [0, 32)
    m.release(b)
    assert m.evict() == 2 and m.index_counts() == {"blocks": 0, "points": 0, "keys": 0}


def test_invariants_catch_a_chain_evicted_under_a_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: eviction no longer keeps live chains; check_invariants must say so."""
    walk = evict_module._walk

    def walk_past_live_chains(core: Core, needs: list[int], max_units: int | None,
                              *passes: tuple[evict_module.Pass, ...]) -> evict_module.Walk:
        core.requests.live = lambda: []  # type: ignore[method-assign]  # the walk sees no live chain
        try:
            return walk(core, needs, max_units, *passes)
        finally:
            del core.requests.live

    monkeypatch.setattr(evict_module, "_walk", walk_past_live_chains)
    monkeypatch.setattr(RequestTable, "chain_tails", lambda self: np.zeros(0, np.int32))  # nor does `drop`
    m = CacheManager(Layout.from_preset("llama_full"), ManagerConfig(default_pool_pages=16, key_seed=0))
    _, b = _evict_under_a_found_chain(m)
    assert m.index_counts()["blocks"] == 0  # block 0, which ends b's chain, went too
    broken = check_invariants(m)
    assert any("live_chains_indexed" in v and f"request {b}" in v and "not indexed under its keys" in v
               for v in broken), broken


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
    """The point a hit resumes at is evicted: acquire names the point, the version the hit recorded and the
    one (and state) found.  Its window page, retired from the index while its publisher still pins it, keeps
    its version: only its state moved (a point refers to its own window pages, so the point moves first)."""
    m = CacheManager(Layout.from_preset("tiny_v4"),
                     ManagerConfig(default_pool_pages=32, retain_every_blocks=1, key_seed=0))
    prompt = np.arange(40)
    _point_without_pins(m, prompt, 16)
    a = m.add_request(prompt)
    m.allocate(a, 16)
    m.commit(a, 16)  # a records the points at 8 and 16 again, publishing and pinning its own window pages
    b = m.add_request(prompt[:17])
    hit = m.match(b)
    assert hit.tokens == 16
    window = "swa.swa_window"
    assert m.pinned(a)[window].get(int(hit.pages[window][-1])) == int(hit.versions[window][-1])  # a's own
    before = m.snapshot()
    m.evict()  # the point at 16 goes: a's window page of block 1 is retired, a still pins it
    with pytest.raises(StaleLease) as stale:
        m.acquire(b, hit)
    err = stale.value
    assert (err.pool, err.page, err.expected_version) == ("resume_point", hit.point, hit.point_version)
    assert err.found_version != err.expected_version and (err.expected_state, err.found_state) == ("KEPT", "FREE")
    assert "state FREE" in str(err) and err.fields["found_state"] == "FREE"
    assert m.snapshot() != before
    now = m.pages(window, hit.pages[window][-1:])
    assert now.states == ("RETIRED",) and now.versions.tolist() == hit.versions[window][-1:].tolist()
    assert m.chain(b) == [] and not any(m.pinned(b).values())


def test_new_point_never_indexes_a_retired_window_page() -> None:
    m = CacheManager(Layout.from_preset("deepseek_v4_flash", block_tokens=16),
                     ManagerConfig(default_pool_pages=64, retain_every_blocks=4, key_seed=0))
    prompt = np.arange(200)
    _point_without_pins(m, prompt, 64)
    b = m.add_request(prompt)
    m.allocate(b, 64)
    m.commit(b, 64)  # b records the point at 64 again, publishing and pinning its own window pages
    assert m.evict(max_units=1) == 1  # that point goes again: b's window pages are retired, b still pins them
    window = "swa.swa_window"
    retired = [p for p in m.pinned(b)[window] if m.pages(window, [p]).states[0] == "RETIRED"]
    assert retired, "no window page of b was retired"
    m.allocate(b, 64)
    m.commit(b, 64)  # the point at 128 needs window blocks 0-7, among them b's retired pages
    assert check_invariants(m) == []
    assert m.match(m.add_request(prompt)).tokens < 128  # so it was not recorded


def test_acquire_refuses_a_hit_whose_block_left_the_index() -> None:
    """Defence in depth: pages shared with earlier blocks could keep their versions when a hit's last block goes
    (no preset reaches it: tails or per-block pages always move first), so acquire also checks the blocks."""
    m = CacheManager(Layout.from_preset("llama_full"), ManagerConfig(default_pool_pages=16, key_seed=0))
    prompt = np.arange(3 * m.layout.block_tokens)
    a = m.add_request(prompt)
    m.allocate(a, 48)
    m.commit(a, 48)
    m.release(a)
    b = m.add_request(prompt)
    hit = m.match(b)
    last = int(hit.block_ids[-1])
    blocks = m.core.index.blocks
    blocks.state[last] = blocks.s_free  # as if dropped while its page stayed published (version kept)
    m.core.objects.generation += 1  # the index changed: acquire may not reuse what match derived
    with pytest.raises(StaleLease) as err:
        m.acquire(b, hit)
    assert (err.value.pool, err.value.page, err.value.found_state, err.value.expected_state) == \
        ("block", last, "FREE", "INDEXED")
    assert err.value.found_version == err.value.expected_version == int(hit.block_versions[-1])
    assert m.chain(b) == [] and not any(m.pinned(b).values())
