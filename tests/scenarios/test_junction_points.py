"""The junction point (ManagerConfig.retain_junction): a request whose prompt leaves a cached chain where no
resume point was kept keeps one there, so the next request that branches at the same place resumes there
instead of recomputing the shared prefix.  With the option off (the retention rule before it) that next
request misses: the check is shown able to fail."""

from __future__ import annotations

import numpy as np
import pytest

from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig, check_invariants
from hkv_core.testing.serving import serve_whole

BLOCK = 8  # tiny_linear's block
SHARED = 3 * BLOCK  # a "system prompt" of three blocks, no multiple of retain_every_blocks


def _manager(preset: str, junction: bool) -> CacheManager:
    return CacheManager(Layout.from_preset(preset), ManagerConfig(default_pool_pages=64, retain_every_blocks=4,
                                                                  retain_junction=junction, key_seed=3))


def _serve(m: CacheManager, tokens: np.ndarray) -> tuple[int, int]:
    """One request whole: (its hit, its match's candidate)."""
    hit = serve_whole(m, tokens)
    return hit.tokens, hit.candidate_tokens


def _question(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(100, 200, 2 * BLOCK + 3)


@pytest.mark.parametrize("preset", ["tiny_linear", "tiny_v4"])
@pytest.mark.parametrize("junction", [True, False])
def test_the_second_branch_keeps_a_point_where_the_third_resumes(preset: str, junction: bool) -> None:
    m = _manager(preset, junction)
    system = np.arange(SHARED) % 50
    assert _serve(m, np.concatenate([system, _question(1)])) == (0, 0)
    # the shared blocks are cached but no point was kept at their end: the second request misses
    assert _serve(m, np.concatenate([system, _question(2)])) == (0, SHARED)
    third = _serve(m, np.concatenate([system, _question(3)]))
    assert third == ((SHARED, SHARED) if junction else (0, SHARED))
    assert check_invariants(m) == []


def test_a_hit_at_a_kept_point_adds_no_junction() -> None:
    """A request that resumes where the cached chain ends keeps no extra point: its candidate is its hit."""
    m = _manager("tiny_linear", True)
    first = np.arange(5 * BLOCK + 5) % 50  # a point at block 4 (every 4 blocks) and at block 5 (its end)
    _serve(m, first)
    points = m.core.index.points.live
    assert points == 2
    hit, candidate = _serve(m, np.concatenate([first[:4 * BLOCK], _question(4)]))
    assert hit == candidate == 4 * BLOCK
    assert m.core.index.points.live == points + 1  # the second prompt's own end only


def test_a_capped_match_leaves_the_junction_and_skip_junction_drops_it() -> None:
    """An engine that matches again with max_tokens (vLLM's EAGLE path) learns nothing about where the cached
    chain ends: the junction stays where the uncapped match found it.  `skip_junction` drops it (a tier will
    load past it).  The manager's snapshot sees the junction, so two managers that differ in it differ."""
    m = _manager("tiny_linear", True)
    system = np.arange(SHARED) % 50
    serve_whole(m, np.concatenate([system, _question(1)]))
    rid = m.add_request(np.concatenate([system, _question(2)]))
    before = m.snapshot()
    assert m.match(rid).candidate_tokens == SHARED
    assert m.snapshot() != before  # the junction is state
    assert m.match(rid, max_tokens=2 * BLOCK).tokens == 0
    end = m.request_tokens(rid)[2]
    assert SHARED in m.retained_boundaries(rid, 0, end)
    m.skip_junction(rid)
    assert SHARED not in m.retained_boundaries(rid, 0, end)
