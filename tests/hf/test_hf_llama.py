"""A second family through the same bridge: HF Llama (GQA; DynamicCache keys and values).

The bridge is not V4-specific: K / V of every position live in one full-attention pool, and what hkv serves
equals HF's own chunked continuation over the same calls, at every block, across tenants and evictions.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the hf extra (transformers, torch) is not installed")

from hkv_exec_ref.hf import HfEngine  # noqa: E402
from hkv_exec_ref.hf import llama as llama_module  # noqa: E402
from hkv_exec_ref.hf.fields import cache_fields  # noqa: E402


def engine(**limits: object) -> HfEngine:
    return HfEngine.tiny("llama", 0, retain_every_blocks=1, **limits)


def test_layout_is_one_full_attention_pool_of_k_and_v() -> None:
    e = engine()
    assert [(p.name, p.entry_shape, p.dtype) for p in e.layout.pools] == [("full.compressed_kv", (2, 2, 8), "fp32")]


def test_served_equals_hf_at_every_block_and_the_restored_cache_matches() -> None:
    e, tokens = engine(), np.random.default_rng(0).integers(0, 64, 61)
    first = e.generate(tokens, 3)
    assert e.matches_recompute(tokens, first)
    for p in range(8, 61, 8):
        served = e.generate(tokens[:p + 3], 3)
        assert served.cached_tokens == p and e.matches_recompute(tokens[:p + 3], served), p
        hit, restored = e.restored_cache(tokens[:p + 1])
        own = e.hf_cache(tokens, tuple(b for b in served.boundaries if b <= hit))
        a, b = cache_fields(restored), cache_fields(own)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), p


def test_tenants_and_evictions() -> None:
    e, tokens = engine(default_pool_pages=16), np.random.default_rng(1).integers(0, 64, 48)
    for salt in (None, "a", "b"):
        served = e.generate(tokens[:30], 2, cache_salt=salt)
        assert served.cached_tokens == 0 and e.matches_recompute(tokens[:30], served)
    again = e.generate(tokens[:45], 2, cache_salt="b")
    assert again.cached_tokens == 24 and e.matches_recompute(tokens[:45], again)
    e.evict()
    for seed in range(2, 6):
        other = np.random.default_rng(seed).integers(0, 64, 40)
        assert e.matches_recompute(other, e.generate(other, 2))


def test_a_bridge_that_writes_v_as_k_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    original = llama_module.write_state

    def k_twice(executor: object, layout: object, alloc: object, before: int, state: object) -> None:
        original(executor, layout, alloc, before, llama_module.KvState(
            prefix_tokens=state.prefix_tokens, keys=state.keys, values=state.keys))  # type: ignore[attr-defined]

    monkeypatch.setattr(llama_module, "write_state", k_twice)
    e, tokens = engine(), np.random.default_rng(2).integers(0, 64, 40)
    e.generate(tokens, 1)
    served = e.generate(tokens[:35], 2)
    assert served.cached_tokens == 32 and not e.matches_recompute(tokens[:35], served)
