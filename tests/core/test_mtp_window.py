"""`ManagerConfig.mtp_window`: the MTP (draft) layer's sliding window as a managed pool.

Off (the default) the manager knows only the main layers' pools.  On, the
MTP window pool joins the window page pool of equal window (or gets its own
page pool when sized differently); every resume point holds its pages, so a
hit includes them and is shortened where they are gone.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from hkv_core.errors import ConfigError, UnknownPool
from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, Hit, ManagerConfig, check_invariants
from hkv_core.manager.lanes import managed_pools
from hkv_core.plan import Completion
from hkv_core.testing.brute_force import brute_force_hit_tokens
from hkv_core.testing.manager_machine import make_manager_machine

MTP = "mtp_swa.swa_window"
MAIN_WINDOWS = ("swa.swa_window", "csa.swa_window", "hca.swa_window")
FRESH = 50_000  # token ids never in a cached prefix


@functools.cache
def flash16() -> Layout:
    return Layout.from_preset("deepseek_v4_flash", block_tokens=16)


def manager(*, pages: int = 128, mtp_pages: int | None = None, **config: object) -> CacheManager:
    pool_pages = {} if mtp_pages is None else {MTP: mtp_pages}
    return CacheManager(flash16(), ManagerConfig(default_pool_pages=pages, pool_pages=pool_pages,
                                                 retain_every_blocks=4, key_seed=1, **config))  # type: ignore[arg-type]


def prompt(seed: int, count: int = 400) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, count, dtype=np.int64)


def serve(m: CacheManager, tokens: np.ndarray, chunk: int = 64) -> Hit:
    """Add, match, acquire, allocate and commit in chunks (copies run at once), release."""
    rid = m.add_request(tokens)
    hit = m.match(rid)
    m.acquire(rid, hit)
    while (done := m.request_tokens(rid)[0]) < len(tokens):
        count = min(chunk, len(tokens) - done)
        alloc = m.allocate(rid, count)
        if alloc.plan is not None:
            m.complete(alloc.plan.plan_id, Completion())
        m.commit(rid, count)
    m.release(rid)
    return hit


def probe(m: CacheManager, tokens: np.ndarray) -> Hit:
    """The hit a new request for `tokens` gets (checked against the naive reference; released again)."""
    rid = m.add_request(tokens)
    try:
        hit = m.match(rid)
        assert hit.tokens == brute_force_hit_tokens(m, rid)
        return hit
    finally:
        m.release(rid)


def extended(tokens: np.ndarray) -> np.ndarray:
    return np.concatenate([tokens, np.arange(FRESH, FRESH + 20, dtype=np.int64)])


def test_the_flag_is_a_boolean() -> None:
    assert ManagerConfig().mtp_window is False
    for bad in (1, "yes", None):
        with pytest.raises(ConfigError) as info:
            ManagerConfig(mtp_window=bad)  # type: ignore[arg-type]
        assert info.value.key == "mtp_window" and repr(bad) in str(info.value)
    assert ManagerConfig(mtp_window=True).mtp_window is True


def test_managed_pools() -> None:
    layout = flash16()
    assert [p.name for p in layout.mtp_pools] == [MTP]
    assert managed_pools(layout, ManagerConfig()) == layout.pools
    assert managed_pools(layout, ManagerConfig(mtp_window=True)) == layout.pools + layout.mtp_pools


def test_default_manages_no_mtp_pool() -> None:
    m = manager()
    assert all(not b.name.startswith("mtp_") for b in m.bindings())
    assert [b.name for b in m.bindings()] == [p.name for p in flash16().pools]
    with pytest.raises(UnknownPool) as info:
        m.pages(MTP)
    assert MTP not in info.value.known and "swa.swa_window" in info.value.known
    with pytest.raises(ConfigError) as err:  # sizing a pool the manager does not manage
        manager(mtp_pages=64)
    assert err.value.key == "pool_pages" and MTP in str(err.value) and "mtp_window=True" in str(err.value)
    serve(m, prompt(0))
    hit = probe(m, extended(prompt(0)))
    assert hit.tokens == 400 and not any(name.startswith("mtp_") for name in hit.pages)


@pytest.mark.parametrize("mtp_pages", [None, 96])  # None: one page pool with the main windows; 96: its own
def test_a_hit_includes_the_mtp_window(mtp_pages: int | None) -> None:
    m = manager(mtp_pages=mtp_pages, mtp_window=True)
    bindings = {b.name: b.pages for b in m.bindings()}
    assert list(bindings) == [p.name for p in flash16().all_pools]
    assert bindings[MTP] == (129 if mtp_pages is None else mtp_pages + 1)
    lanes = [pool.spec.member_names for pool in m.core.pools]
    assert ((*MAIN_WINDOWS, MTP) in lanes) if mtp_pages is None else (MAIN_WINDOWS in lanes and (MTP,) in lanes)
    first = serve(m, prompt(0))
    assert first.tokens == 0
    hit = probe(m, extended(prompt(0)))
    assert hit.tokens == 400
    mtp, main = hit.pages[MTP].tolist(), hit.pages["swa.swa_window"].tolist()
    assert len(mtp) == len(main) == 8  # W = 128 tokens: 8 blocks of 16
    if mtp_pages is None:
        assert mtp == main  # one page-id space
    assert set(m.pages(MTP, mtp).states) == {"PUBLISHED"}
    assert check_invariants(m) == []
    assert m.evict() > 0  # everything unpinned goes, the MTP window pages with their points
    assert set(m.pages(MTP, mtp).states) == {"FREE"}
    assert m.free_pages(MTP) == bindings[MTP] - 1
    assert probe(m, extended(prompt(0))).tokens == 0
    assert check_invariants(m) == []


def test_a_scarce_mtp_window_shortens_hits() -> None:
    """The MTP window pool in its own, small page pool: serving other prompts must evict resume points for
    its pages (the main pools have room) - the oldest chain's first, deepest first - so the first prompt's
    hit shortens and goes sooner than without the flag, and every hit on the way reads MTP window pages that
    exist (a hit never reads a FREE MTP page)."""
    found = {}
    for mtp_window in (False, True):
        m = manager(mtp_pages=40, mtp_window=True) if mtp_window else manager()
        serve(m, prompt(0))
        hits = []
        for other in range(1, 5):
            serve(m, prompt(other))
            hit = probe(m, extended(prompt(0)))
            hits.append(hit.tokens)
            if mtp_window and hit.tokens:
                mtp = hit.pages[MTP].tolist()
                assert len(mtp) == len(hit.pages["swa.swa_window"]) == 8
                assert set(m.pages(MTP, mtp).states) == {"PUBLISHED"}
            elif mtp_window and hit.reasons:  # (no reason at all: the chain's blocks went too)
                details = {r.code: r.detail for r in hit.reasons}
                assert f"{MTP}: usable to block" in details["WINDOW_MISSING"]  # its points went whole
            assert check_invariants(m) == []
        m.acquire(rid := m.add_request(extended(prompt(0))), m.match(rid))
        assert m.request_tokens(rid)[0] == hits[-1]
        m.release(rid)
        assert check_invariants(m) == []
        found[mtp_window] = hits
    assert found == {False: [400] * 4, True: [400, 192, 0, 0]}


Flash16Mtp = make_manager_machine("deepseek_v4_flash", block_tokens=16, default_pool_pages=128,
                                  retain_every_blocks=4, mtp_window=True, pool_pages={MTP: 64})


def test_the_manager_machine_with_an_mtp_window() -> None:
    """The scheduler-like state machine (invariants, hits vs. the model, failed calls change nothing)."""
    run_state_machine_as_test(Flash16Mtp, settings=settings(max_examples=max(1, settings().max_examples // 10),
                                                            stateful_step_count=30))
