"""HF transformers' DeepSeek-V4 served through hkv: the restored cache continues bit-identically.

HF's model is the independent reference for what a V4 resume point holds.  For every retained P (every block
here), across tenants and evictions, what hkv serves equals HF run with its own cache over the same calls
(`torch.equal`-strict: np.array_equal of float32 logits), and the cache hkv rebuilds from its pools at P equals
HF's own cache after those calls, field by field.  Broken bridges are caught.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the hf extra (transformers, torch) is not installed")

from hkv_core.errors import InvalidArgument  # noqa: E402
from hkv_exec_ref.hf import HfEngine, v4_cache  # noqa: E402
from hkv_exec_ref.hf.fields import cache_fields  # noqa: E402

BASE_TOKENS = 61


def engine(**limits: Any) -> HfEngine:
    return HfEngine.tiny("deepseek_v4", 0, retain_every_blocks=1, **limits)


def base(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 64, BASE_TOKENS)


def differing_fields(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    assert a.keys() == b.keys(), set(a) ^ set(b)
    return [k for k in a if not np.array_equal(a[k], b[k])]


def test_served_equals_hf_over_the_same_calls_at_every_block() -> None:
    e, tokens = engine(), base()
    first = e.generate(tokens, 3)
    assert first.cached_tokens == 0 and e.matches_recompute(tokens, first)
    hits = []
    for p in range(8, BASE_TOKENS, 8):
        prompt = tokens[:p + 3]
        served = e.generate(prompt, 3)
        hits.append(served.cached_tokens)
        assert e.matches_recompute(prompt, served), f"hit at {served.cached_tokens}: served != HF"
    assert hits == list(range(8, BASE_TOKENS, 8)), hits


def test_tenants_and_evictions_keep_outputs_exact() -> None:
    e, tokens = engine(default_pool_pages=24), base(1)
    for salt in (None, "tenant-a", "tenant-b"):
        served = e.generate(tokens[:40], 2, cache_salt=salt)
        assert served.cached_tokens == 0, "another tenant's prefix was hit"
        assert e.matches_recompute(tokens[:40], served)
    again = e.generate(tokens[:50], 2, cache_salt="tenant-a")
    assert again.cached_tokens == 40 and e.matches_recompute(tokens[:50], again)
    e.evict()
    after = e.generate(tokens[:50], 2, cache_salt="tenant-a")
    assert after.cached_tokens == 0 and e.matches_recompute(tokens[:50], after)
    for seed in range(2, 8):  # more prompts than the 24 pages hold: the manager evicts as it goes
        other = base(seed)[:45]
        assert e.matches_recompute(other, e.generate(other, 2))
    last = e.generate(tokens[:50], 2, cache_salt="tenant-a")
    assert e.matches_recompute(tokens[:50], last)


def test_restored_cache_equals_hfs_own_field_by_field() -> None:
    e, tokens = engine(), base(2)
    served = e.generate(tokens, 2)
    for p in range(8, BASE_TOKENS, 8):
        hit, restored = e.restored_cache(tokens[:p + 1])
        assert hit == p
        own = e.hf_cache(tokens, tuple(b for b in served.boundaries if b <= p))
        assert differing_fields(cache_fields(restored), cache_fields(own)) == [], f"P={p}"
    fields = cache_fields(restored)
    assert any("overlap_kv[indexer]" in k for k in fields) and any("buffer_gate[compressor]" in k for k in fields)


def test_a_bridge_that_loses_the_overlap_rows_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    original = v4_cache._restore_compressor

    def zero_overlap(layer: Any, name: str, entries: Any, tail: Any, p: int, ratio: int, overlap: int) -> None:
        original(layer, name, entries, tail, p, ratio, overlap)
        if overlap > 1 and layer.overlap_kv[name] is not None:
            layer.overlap_kv[name] = layer.overlap_kv[name] * 0

    monkeypatch.setattr(v4_cache, "_restore_compressor", zero_overlap)
    e, tokens = engine(), base(3)
    e.generate(tokens, 1)
    served = e.generate(tokens[:44], 2)
    assert served.cached_tokens == 40 and not e.matches_recompute(tokens[:44], served)
    hit, restored = e.restored_cache(tokens[:41])
    own = e.hf_cache(tokens, tuple(b for b in served.boundaries if b <= hit))
    bad = differing_fields(cache_fields(restored), cache_fields(own))
    assert any("overlap_kv" in k for k in bad), bad  # and what was computed from it


def test_a_bridge_that_adds_the_position_bias_to_open_rows_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """hkv's own model keeps z = gate + bias; HF's open-block rows hold the gate without it (docs/hf.md).  Every
    sub-chunk starts from the pools, and sub-chunks start inside blocks, where open rows exist."""
    original = v4_cache._restore_compressor

    def biased(layer: Any, name: str, entries: Any, tail: Any, p: int, ratio: int, overlap: int) -> None:
        original(layer, name, entries, tail, p, ratio, overlap)
        gate = layer.buffer_gate[name]
        if gate is not None and gate.shape[1]:
            layer.buffer_gate[name] = gate + 0.25

    e, tokens = engine(), base(4)
    honest = e.generate(tokens[:30], 2)
    assert e.matches_recompute(tokens[:30], honest)
    monkeypatch.setattr(v4_cache, "_restore_compressor", biased)
    broken = engine()
    served = broken.generate(tokens[:30], 2)
    assert any(b % 8 for b in served.boundaries), "no call started inside a block"
    assert not broken.matches_recompute(tokens[:30], served)


def test_a_block_computed_twice_keeps_the_first_calls_and_mixed_blocks_are_flagged() -> None:
    """The index keeps a block's first computation, so `boundaries` name its calls.  A request whose prompt is an
    earlier request's tokens exactly hits one block short and computes that block again with other calls (other
    bits); blocks it adds on top are mixed - no single HF run gives that state - and a hit through them has no
    boundaries (docs/hf.md)."""
    e, tokens = engine(), base(5)
    first = e.generate(tokens[:20], 5)
    again = np.concatenate([tokens[:20], first.tokens[:4]])  # the 24 tokens the first request fed
    second = e.generate(again, 10)
    assert second.cached_tokens == 16 and e.matches_recompute(again, second)
    resumed = np.concatenate([again, tokens[30:35]])
    third = e.generate(resumed, 3)  # hits at 24: the first request's block 2
    assert third.cached_tokens == 24 and e.matches_recompute(resumed, third)
    through = np.concatenate([again, second.tokens[:9], tokens[30:33]])
    mixed = e.generate(through, 3)  # hits at 32: block 3 was built on the second request's block 2
    assert mixed.cached_tokens == 32 and mixed.boundaries == () and not e.matches_recompute(through, mixed)


def test_recompute_refuses_boundaries_that_do_not_describe_the_calls() -> None:
    e, tokens = engine(), base(6)
    for bad in ((8, 8, 20), (8, 16), (20, 19), (20, 23, 30)):
        with pytest.raises(InvalidArgument, match="boundaries"):
            e.recompute(tokens[:20], 4, boundaries=bad)
