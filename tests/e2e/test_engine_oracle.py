"""The exactness oracle end to end: TinyV4 served through the CacheManager and the RefExecutor
equals recomputation bit for bit, for every hit length, chunking, workload and eviction; and the
oracle is able to fail (fault switches, a scribbled pool page)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hkv_core.manager import check_invariants
from hkv_core.plan import FillPages, Plan
from hkv_exec_ref import Engine, ServeResult
from hkv_exec_ref.tiny_v4 import Fault

BASE = np.random.default_rng(2024).integers(0, 64, 64)
PREFIXES = range(49)  # every residue class mod 4 and mod 8; hits at every block boundary 0..48
CHUNKS = (1, 3, 7, None)  # None: the whole prompt in one allocation
NEW = 3
BIG = {"default_pool_pages": 2048, "retain_every_blocks": 1}


def prompt_at(p: int) -> np.ndarray:
    """BASE[:p] then 8 tokens whose first differs from BASE[p]: no request can share block p // 8."""
    tail = np.random.default_rng(p).integers(0, 64, 8)
    tail[0] = (BASE[p] + 1 + p) % 64 if (BASE[p] + 1 + p) % 64 != BASE[p] else (BASE[p] + 2) % 64
    return np.concatenate([BASE[:p], tail])


@functools.cache
def primed(chunk: int | None) -> Engine:
    """One engine per chunk size, primed with BASE: a resume point at every block boundary."""
    engine = Engine.tiny(check_states=True, **BIG)
    first = engine.generate(BASE, 1, chunk_tokens=chunk)
    assert first.cached_tokens == 0
    return engine


@functools.cache
def recomputed(p: int) -> ServeResult:
    return primed(None).recompute(prompt_at(p), NEW)


def assert_exact(served: ServeResult, cold: ServeResult) -> None:
    assert np.array_equal(served.tokens, cold.tokens)
    assert np.array_equal(served.logits, cold.logits)
    assert np.array_equal(served.prompt_logits, cold.prompt_logits[served.cached_tokens:])


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("p", PREFIXES)
def test_serving_after_a_hit_equals_recompute(p: int, chunk: int | None) -> None:
    engine = primed(chunk)
    served = engine.generate(prompt_at(p), NEW, chunk_tokens=chunk)
    hit = p // 8 * 8  # the largest block boundary <= p
    assert served.cached_tokens == hit
    assert served.cached_by_kind == {"compressed_kv": hit, "compressor_tail": min(hit, 4),
                                     "swa_window": min(hit, 7), "indexer_state": hit}
    assert ("LCM_BOUNDARY" in served.reasons) == (hit > 0)
    assert_exact(served, recomputed(p))


def test_primed_engines_keep_their_invariants() -> None:
    for chunk in CHUNKS:
        assert check_invariants(primed(chunk).manager) == []


def test_whole_prompt_hit_stops_one_block_short_and_salts_separate_caches() -> None:
    engine = Engine.tiny(**BIG)
    prompt = BASE[:40]
    cold = engine.recompute(prompt, 4)
    assert_exact(engine.generate(prompt, 4, cache_salt="a"), cold)
    again = engine.generate(prompt, 4, cache_salt="a")
    assert again.cached_tokens == 32 and "PARTIAL_BLOCK" in again.reasons  # at least one token computed
    assert_exact(again, cold)
    other = engine.generate(prompt, 4, cache_salt="b")
    assert other.cached_tokens == 0
    assert_exact(other, cold)


def test_forced_eviction_turns_hits_into_misses_with_equal_outputs() -> None:
    engine = Engine.tiny(**BIG)
    cold = engine.recompute(BASE[:30], 5)
    assert_exact(engine.generate(BASE[:30], 5, chunk_tokens=4), cold)
    assert engine.generate(BASE[:30], 5).cached_tokens == 24
    assert engine.evict(tier="device") > 0
    miss = engine.generate(BASE[:30], 5, chunk_tokens=6)
    assert miss.cached_tokens == 0
    assert_exact(miss, cold)
    with pytest.raises(ValueError):
        engine.evict(tier="disk")


REQUEST = st.tuples(st.integers(0, 2),  # base prompt
                    st.integers(0, 48),  # shared prefix length
                    st.integers(1, 12),  # divergent tokens after it
                    st.integers(0, 4),  # new tokens
                    st.sampled_from([None, 1, 2, 3, 5, 8, 13]),  # chunk
                    st.sampled_from([None, None, "tenant-a"]),  # salt
                    st.booleans())  # force an eviction afterwards
BASES = [np.random.default_rng(100 + i).integers(0, 64, 64) for i in range(3)]


@pytest.mark.parametrize("eviction", ["lru", "adaptive"])
@settings(max_examples=12)
@given(st.lists(REQUEST, min_size=2, max_size=7), st.integers(1, 3), st.integers(0, 3))
def test_random_workloads_equal_recompute(eviction: str,
                                          requests: list[tuple[int, int, int, int, int | None, str | None, bool]],
                                          retain: int, seed: int) -> None:
    engine = Engine.tiny(seed=seed, default_pool_pages=40, retain_every_blocks=retain, check_states=True,
                         eviction=eviction)
    rng = np.random.default_rng(seed)
    for base, shared, extra, new, chunk, salt, evict in requests:
        prompt = np.concatenate([BASES[base][:shared], rng.integers(0, 64, extra)])
        served = engine.generate(prompt, new, chunk_tokens=chunk, cache_salt=salt)
        assert served.cached_tokens <= max(0, (len(prompt) - 1) // 8 * 8)
        assert_exact(served, engine.recompute(prompt, new))
        if evict:
            engine.evict()
    assert check_invariants(engine.manager) == []
    assert engine.executor.addresses() == engine.addresses


def test_the_adaptive_policy_serves_a_pressured_engine_exactly_and_learns_from_its_outputs() -> None:
    """ManagerConfig(eviction="adaptive") in a serving engine: 16 pages a pool for chats that need more, so the
    adaptive policy orders every eviction; outputs equal recomputation, and it is told each released
    request's output tokens (its admission buckets)."""
    from hkv_core.manager.index.adaptive import AdaptivePolicy

    engine = Engine.tiny(default_pool_pages=16, retain_every_blocks=1, check_states=True, eviction="adaptive")
    policy = engine.manager.core.index.policy
    assert isinstance(policy, AdaptivePolicy)
    hits = 0
    for turn in range(6):
        for base in BASES:
            prompt = np.concatenate([base[:16 + 8 * turn], [turn + 1]])
            served = engine.generate(prompt, 3)
            assert_exact(served, engine.recompute(prompt, 3))
            hits += served.cached_tokens
            assert policy.bucket == (3).bit_length()  # 3 output tokens: bucket 2
    assert hits > 0 and engine.manager.core.stats["evictions"] > 0
    assert policy.clock > 0 and check_invariants(engine.manager) == []


# --- the oracle can fail ----------------------------------------------------------------------

FAULTS = [Fault.DROP_OVERLAP_BLOCK, Fault.DROP_TAIL, Fault.DROP_WINDOW_ROW, Fault.DROP_INDEXER_KEYS]


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
def test_a_broken_resume_changes_the_logits(fault: Fault) -> None:
    engine = Engine.tiny(faults=fault, **BIG)
    engine.generate(BASE[:48], 1, chunk_tokens=5)
    prompt = np.concatenate([BASE[:32], BASE[40:52]])
    served = engine.generate(prompt, 4, chunk_tokens=3)
    assert served.cached_tokens == 32
    cold = engine.recompute(prompt, 4)
    assert not np.array_equal(served.prompt_logits, cold.prompt_logits[32:])
    assert not engine.matches_recompute(prompt, served)


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
def test_a_fault_at_the_hit_alone(fault: Fault) -> None:
    """Primed without faults; then the only state read from the pools at P > 0 is the hit's (P = 32,
    one sub-chunk of 7 tokens, one token generated).  At a block boundary the open compressor block is
    empty, so DROP_TAIL has nothing to drop there; every other piece is needed.  (The suffix is one
    whose queries select the entry pooled over the overlap block: most suffixes do.)"""
    engine = Engine.tiny(**BIG)
    engine.generate(BASE[:48], 1)
    engine.faults = fault
    prompt = np.concatenate([BASE[:32], BASE[52:59]])
    served = engine.generate(prompt, 1)
    assert served.cached_tokens == 32
    equal = np.array_equal(served.prompt_logits, engine.recompute(prompt, 1).prompt_logits[32:])
    assert equal == (fault is Fault.DROP_TAIL)


def test_a_scribbled_window_page_changes_the_logits() -> None:
    """The state really comes from the pools: overwrite one cached window page and the hit differs."""
    engine = Engine.tiny(**BIG)
    engine.generate(BASE[:48], 1)
    rid = engine.manager.add_request(BASE[:40])
    hit = engine.manager.match(rid)
    page, version = int(hit.pages["csa.swa_window"][-1]), int(hit.versions["csa.swa_window"][-1])
    engine.manager.release(rid)
    engine.executor.run(Plan(ops=(FillPages(pool="csa.swa_window", pages=(page,), versions=(version,), value=0),)))
    served = engine.generate(BASE[:40], 2)
    assert served.cached_tokens == 32
    assert not engine.matches_recompute(BASE[:40], served)
