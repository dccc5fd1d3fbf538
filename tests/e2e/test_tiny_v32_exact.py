"""The tiny DeepSeek-V3.2-style model (tiny_v32: MLA latents, a lightning indexer choosing top-k earlier tokens)
is exact: served through hkv - both per-token kinds, the latent and the indexer key, read from their own pools -
its logits equal recomputation bit for bit at every block, with chunked prefill and through evictions.  A broken
variant whose hits lose the indexer keys (as managers that never offloaded them, docs/failures.md F4) is caught."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hkv_core.layout import Layout, load_preset_config
from hkv_core.manager import CacheManager, ManagerConfig, check_invariants
from hkv_exec_ref.executor import RefExecutor
from hkv_exec_ref.tiny_v32 import TinyV32, V32Config, V32Server, V32State

BLOCK = 8
BASE = tuple(int(t) for t in np.random.default_rng(5).integers(0, 64, 48))


@functools.cache
def model() -> TinyV32:
    return TinyV32(V32Config.from_hf_config(load_preset_config("tiny_v32")))


@functools.cache
def recompute(tokens: tuple[int, ...]) -> np.ndarray:
    return model().recompute(np.array(tokens, np.int64))


def server(*, pages: int = 64, broken: bool = False) -> V32Server:
    manager = CacheManager(Layout.from_preset("tiny_v32"), ManagerConfig(default_pool_pages=pages, key_seed=6))
    return V32Server(model(), manager, RefExecutor(), drop_indexer_keys=broken)


@given(cuts=st.lists(st.integers(1, 47), max_size=4))
@settings(max_examples=25, deadline=None)
def test_the_model_is_chunk_invariant(cuts: list[int]) -> None:
    tokens, state, out, at = np.array(BASE), V32State.empty(model().config), [], 0
    for cut in sorted(set(cuts)) + [48]:
        logits, state = model().forward(tokens[at:cut], state)
        out.append(logits)
        at = cut
    assert np.array_equal(np.concatenate(out), recompute(BASE))


@pytest.mark.parametrize("shared", [8, 13, 24, 40, 47])
@pytest.mark.parametrize("chunk", [3, None])
def test_serving_after_a_hit_equals_recompute(shared: int, chunk: int | None) -> None:
    srv = server()
    assert np.array_equal(srv.prefill(BASE, chunk_tokens=5).logits, recompute(BASE))
    prompt = BASE[:shared] + (60, 61)
    served = srv.prefill(prompt, chunk_tokens=chunk)
    assert served.cached_tokens == shared // BLOCK * BLOCK
    assert np.array_equal(served.logits, recompute(prompt)[served.cached_tokens:])
    assert check_invariants(srv.manager) == []


@given(steps=st.lists(st.tuples(st.integers(0, 47), st.integers(1, 12), st.integers(0, 3), st.integers(1, 9)),
                      min_size=2, max_size=8), pages=st.integers(8, 30))
@settings(max_examples=20, deadline=None)
def test_hits_through_evictions_equal_recompute(steps: list[tuple[int, int, int, int]], pages: int) -> None:
    srv = server(pages=pages)
    for shared, extra, evict, chunk in steps:
        prompt = BASE[:shared] + tuple(range(extra))
        served = srv.prefill(prompt, chunk_tokens=chunk)
        assert np.array_equal(served.logits, recompute(prompt)[served.cached_tokens:])
        if evict:
            srv.manager.evict(evict)
        assert check_invariants(srv.manager) == []


def test_broken_variant_losing_the_indexer_keys_is_caught() -> None:
    srv = server(broken=True)
    srv.prefill(BASE)
    prompt = BASE[:40] + (1, 2)
    served = srv.prefill(prompt)
    assert served.cached_tokens == 40
    assert not np.array_equal(served.logits, recompute(prompt)[40:])
