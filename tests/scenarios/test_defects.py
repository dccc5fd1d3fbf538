"""Regression tests for the defects found at commit 0c572f4 (each failed there).

1. swa_full: match returned a hit that acquire refused although nothing moved
   (match and acquire disagreed on what a usable resume point is).
2. allow_partial_page_copy=False kept resume points no hit could use.
3. A prompt's last, incomplete prefix page was never published: a follow-up
   resumed only at page ends (V4-Flash block 16: a 300-token prompt gave 0).
4. Failing calls changed state (a float or uint64 count), and a zeroed window
   table went unnoticed by check_invariants.
5. acquire trusted the pages a Hit listed: writable arrays, never checked
   against the index.
"""

from __future__ import annotations

import numpy as np
import pytest

from hkv_core.errors import HkvError
from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, InvalidRequestState, ManagerConfig, StaleLease, check_invariants
from hkv_core.plan import Completion


def serve(m: CacheManager, tokens: np.ndarray) -> int:
    """A whole request: match, acquire, allocate and commit the rest, release; returns the hit."""
    rid = m.add_request(tokens)
    hit = m.match(rid)
    m.acquire(rid, hit)
    todo = len(tokens) - hit.tokens
    alloc = m.allocate(rid, todo)
    if alloc.plan is not None:
        m.complete(alloc.plan.plan_id, Completion())
    m.commit(rid, todo)
    m.release(rid)
    return hit.tokens


# ------------------------------------------------------------------ 1. one definition of a resume point


@pytest.mark.parametrize("preset", ["swa_full", "tiny_v4", "tiny_csa", "llama_full", "deepseek_v4_flash"])
def test_a_hit_match_returns_is_acquired_when_nothing_moved(preset: str) -> None:
    block = 16 if preset == "deepseek_v4_flash" else None
    m = CacheManager(Layout.from_preset(preset, block_tokens=block), ManagerConfig(key_seed=0, default_pool_pages=512))
    base = np.arange(400)
    serve(m, base[:320])
    serve(m, base[:352])
    for end in range(1, 400, 7):
        rid = m.add_request(base[:end])
        hit = m.match(rid)
        m.acquire(rid, hit)  # raised StaleLease at 0c572f4 for swa_full, 340 tokens (hit 336)
        m.release(rid)
    assert check_invariants(m) == []


def test_swa_full_reproduction_from_the_issue() -> None:
    m = CacheManager(Layout.from_preset("swa_full"), ManagerConfig(key_seed=0))
    base = np.arange(400)
    serve(m, base[:320])
    serve(m, base[:352])
    rid = m.add_request(base[:340])
    hit = m.match(rid)
    m.acquire(rid, hit)
    assert hit.tokens > 0 and hit.point >= 0


# ------------------------------------------------------------------ 2. only usable points are kept


def test_without_partial_page_copy_only_lcm_points_are_kept() -> None:
    layout = Layout.from_preset("deepseek_v4_flash", block_tokens=16)
    m = CacheManager(layout, ManagerConfig(key_seed=0, allow_partial_page_copy=False, retain_every_blocks=4))
    serve(m, np.arange(1100))
    assert m.index_counts()["points"] == 2  # 512 and 1024: 17 were kept at 0c572f4


# ------------------------------------------------------------------ 3. resume inside a partial page


def test_follow_up_resumes_at_the_prompt_end_inside_a_page() -> None:
    layout = Layout.from_preset("deepseek_v4_flash", block_tokens=16)
    m = CacheManager(layout, ManagerConfig(key_seed=0))
    prompt = np.arange(300)
    serve(m, prompt)
    rid = m.add_request(np.concatenate([prompt, np.arange(1000, 1040)]))
    hit = m.match(rid)
    assert hit.tokens == 288 and hit.partial_copy  # 0 at 0c572f4: the HCA page [0, 512) was never published
    m.acquire(rid, hit)
    alloc = m.allocate(rid, 340 - 288)
    assert alloc.plan is not None and any(op.pool == "hca.compressed_kv" for op in alloc.plan.ops)


# ------------------------------------------------------------------ 4. failing calls change nothing


def _requested(m: CacheManager) -> int:
    rid = m.add_request(np.arange(64))
    m.acquire(rid, m.match(rid))
    m.allocate(rid, 40)
    return rid


@pytest.mark.parametrize(("call", "count"), [("commit", 2.5), ("allocate", 2.0), ("commit", True), ("allocate", -1),
                                             ("commit", 10**12), ("allocate", "3"), ("commit", np.float32(2)),
                                             ("allocate", np.uint64(2**63))])
def test_bad_counts_raise_typed_errors_and_change_nothing(call: str, count: object) -> None:
    m = CacheManager(Layout.from_preset("tiny_v4"), ManagerConfig(key_seed=0, default_pool_pages=64))
    rid = _requested(m)
    before = m.snapshot()
    with pytest.raises(InvalidRequestState):
        getattr(m, call)(rid, count)
    assert m.snapshot() == before
    assert check_invariants(m) == []


@pytest.mark.parametrize("call", ["commit", "allocate"])
def test_numpy_integer_counts_do_what_python_ints_do(call: str) -> None:
    """np.uint64(2) moved `computed` by 2.5-style arithmetic and zeroed the window table at 0c572f4."""
    results = []
    for count in (2, np.uint64(2), np.int32(2)):
        m = CacheManager(Layout.from_preset("tiny_v4"), ManagerConfig(key_seed=0, default_pool_pages=64))
        rid = _requested(m)
        getattr(m, call)(rid, count)
        assert check_invariants(m) == []
        results.append(m.snapshot())
    assert results[0] == results[1] == results[2]


def test_a_zeroed_window_table_is_caught_by_check_invariants() -> None:
    m = CacheManager(Layout.from_preset("tiny_v4"), ManagerConfig(key_seed=0, default_pool_pages=64))
    rid = _requested(m)
    m.commit(rid, 24)
    assert check_invariants(m) == []
    req = m.core.requests.by_rid[rid]
    window = next(p for p in m.core.pools if p.spec.window_tokens)
    req.tables[window.index].clear(0, len(req.tables[window.index]))  # what commit(rid, np.uint64(2)) did
    broken = check_invariants(m)
    assert any(b.startswith("lease_covers_object_set") and "window" in b for b in broken), broken


# ------------------------------------------------------------------ 5. acquire re-derives a hit's pages


def test_a_hit_is_read_only() -> None:
    m = CacheManager(Layout.from_preset("tiny_v4"), ManagerConfig(key_seed=0, default_pool_pages=64))
    serve(m, np.arange(64))
    rid = m.add_request(np.arange(70))
    hit = m.match(rid)
    assert hit.tokens == 64
    for array in (hit.block_ids, hit.block_versions, *hit.pages.values(), *hit.versions.values()):
        with pytest.raises(ValueError):
            array[...] = 0
    name = next(iter(hit.pages))
    for mapping in (hit.pages, hit.versions):  # acquire takes match's own hit as it is: nothing may swap in
        with pytest.raises(TypeError):
            mapping[name] = np.zeros(0, np.int64)  # type: ignore[index]


def test_acquire_refuses_a_hit_whose_pages_were_swapped() -> None:
    m = CacheManager(Layout.from_preset("tiny_v4"), ManagerConfig(key_seed=0, default_pool_pages=128))
    serve(m, np.arange(64))
    serve(m, np.arange(500, 564))
    rid = m.add_request(np.arange(70))
    hit = m.match(rid)
    other = m.add_request(np.arange(500, 570))
    theirs = m.match(other)
    assert hit.tokens == theirs.tokens == 64
    window = next(name for name in hit.pages if "swa_window" in name)
    pages = dict(hit.pages)
    pages[window] = theirs.pages[window]  # another prompt's window pages, with their versions
    versions = dict(hit.versions)
    versions[window] = theirs.versions[window]
    forged = type(hit)(request_id=hit.request_id, tokens=hit.tokens, candidate_tokens=hit.candidate_tokens,
                       reasons=hit.reasons, block_ids=hit.block_ids.copy(), block_versions=hit.block_versions.copy(),
                       pages=pages, versions=versions, partial_copy=hit.partial_copy, point=hit.point,
                       point_version=hit.point_version)
    before = m.snapshot()
    with pytest.raises(StaleLease) as info:
        m.acquire(rid, forged)
    assert info.value.pool == window
    assert m.snapshot() == before
    m.acquire(rid, hit)  # the genuine hit still works


def test_errors_are_hkv_errors() -> None:
    assert issubclass(InvalidRequestState, HkvError) and issubclass(StaleLease, HkvError)
