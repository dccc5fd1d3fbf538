"""The tiny linear hybrid (tiny_linear: three Gated-DeltaNet-style layers, one full-attention layer) is exact:
its logits never depend on chunking or on where it resumed, and served through hkv - the full layer's K / V
from block pages, the linear layers' recurrent state from the snapshot kept at the hit, copied on write into
the request's working pages - they equal recomputation bit for bit, at every retained point and through
evictions.  A broken variant that skips the copy-on-write plan is caught by the same oracle."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hkv_core.layout import Layout, ObjectKind, PoolSpec, load_preset_config
from hkv_core.manager import CacheManager, ManagerConfig, check_invariants
from hkv_exec_ref.executor import RefExecutor
from hkv_exec_ref.tiny_linear import HybridConfig, HybridServer, HybridState, TinyHybrid
from hkv_tiers.link import TierOptions

VOCAB, BLOCK = 64, 8


@functools.cache
def model() -> TinyHybrid:
    return TinyHybrid(HybridConfig.from_hf_config(load_preset_config("tiny_linear")))


@functools.cache
def recompute(tokens: tuple[int, ...]) -> np.ndarray:
    return model().recompute(np.array(tokens, np.int64))


def server(*, pages: int = 64, every: int = 1, broken: bool = False, in_place: bool = False) -> HybridServer:
    manager = CacheManager(Layout.from_preset("tiny_linear"),
                           ManagerConfig(default_pool_pages=pages, retain_every_blocks=every, key_seed=2))
    return HybridServer(model(), manager, RefExecutor(), skip_state_copy=broken, draft_in_place=in_place)


BASE = tuple(int(t) for t in np.random.default_rng(7).integers(0, VOCAB, 48))


@given(cuts=st.lists(st.integers(1, 47), max_size=4))
@settings(max_examples=30, deadline=None)
def test_the_model_is_chunk_invariant(cuts: list[int]) -> None:
    tokens, state, out, at = np.array(BASE), HybridState.empty(model().config), [], 0
    for cut in sorted(set(cuts)) + [48]:
        logits, state = model().forward(tokens[at:cut], state)
        out.append(logits)
        at = cut
    assert np.array_equal(np.concatenate(out), recompute(BASE))
    assert state.tokens == 48 and all(v.shape == (2, 4, 4) for v in state.ssm.values())


def test_the_state_is_the_layouts() -> None:
    layout, cfg = Layout.from_preset("tiny_linear"), model().config
    group = next(g for g in layout.groups if g.state is not None)
    assert group.state is not None and group.layer_ids == cfg.linear_layers
    assert group.state.conv_shape == (cfg.conv_channels, cfg.kernel - 1)
    assert group.state.ssm_shape == (cfg.value_heads, cfg.key_dim, cfg.value_dim)


@pytest.mark.parametrize("shared", [8, 13, 16, 24, 31, 32, 40, 47])
@pytest.mark.parametrize("chunk", [3, None])
def test_serving_after_a_hit_equals_recompute(shared: int, chunk: int | None) -> None:
    srv = server()
    first = srv.prefill(BASE, chunk_tokens=11)
    assert first.cached_tokens == 0 and np.array_equal(first.logits, recompute(BASE))
    prompt = BASE[:shared] + (63, 62, 61)
    served = srv.prefill(prompt, chunk_tokens=chunk)
    assert served.cached_tokens == shared // BLOCK * BLOCK  # a point at every block boundary
    assert np.array_equal(served.logits, recompute(prompt)[served.cached_tokens:])
    assert check_invariants(srv.manager) == []


@given(steps=st.lists(st.tuples(st.integers(0, 47), st.integers(1, 12), st.integers(0, 3),
                                st.integers(1, 9)), min_size=2, max_size=8),
       every=st.sampled_from([1, 2]), pages=st.integers(10, 40))
@settings(max_examples=25, deadline=None)
def test_hits_through_evictions_equal_recompute(steps: list[tuple[int, int, int, int]], every: int,
                                                pages: int) -> None:
    """Prompts sharing random prefixes of one base, random chunks, evictions between them: every served
    position equals recomputation, whatever the cache still held."""
    srv = server(pages=pages, every=every)
    for shared, extra, evict, chunk in steps:
        prompt = BASE[:shared] + tuple(range(extra))
        served = srv.prefill(prompt, chunk_tokens=chunk)
        assert np.array_equal(served.logits, recompute(prompt)[served.cached_tokens:])
        if evict:
            srv.manager.evict(evict)
        assert check_invariants(srv.manager) == []


def test_broken_variant_without_copy_on_write_is_caught() -> None:
    """Skipping the plan that copies the hit's state into the working pages serves a wrong state."""
    srv = server(broken=True)
    srv.prefill(BASE)
    srv.prefill(tuple(range(40)))  # the working pages the next request gets hold another request's state
    prompt = BASE[:24] + (5, 6)
    served = srv.prefill(prompt)
    assert served.cached_tokens == 24
    assert not np.array_equal(served.logits, recompute(prompt)[24:])


NEW = 14


@functools.cache
def greedy(prompt: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The greedy continuation of `prompt` and the logits of every position, with no cache at all."""
    tokens = list(prompt)
    for _ in range(NEW):
        tokens.append(int(np.argmax(model().recompute(np.array(tokens, np.int64))[-1])))
    return np.array(tokens[len(prompt):], np.int64), model().recompute(np.array(tokens[:-1], np.int64))


@given(shared=st.integers(0, 40), k=st.integers(1, 4), wrong=st.sets(st.integers(0, NEW - 1), max_size=5),
       retain=st.sampled_from([1, 2]))
@settings(max_examples=25, deadline=None)
def test_speculative_decoding_after_a_hit_equals_recompute(shared: int, k: int, wrong: set[int],
                                                           retain: int) -> None:
    """Drafts that are right up to a random wrong guess: every step is verified in one pass, the rejected
    positions' state is dropped, and the tokens and logits equal plain greedy decoding with no cache."""
    srv = server(every=retain)
    srv.prefill(BASE)
    prompt = BASE[:shared] + (3, 1, 4)
    tokens, logits = greedy(prompt)
    guess = tokens.copy()
    for i in wrong:
        guess[i] = (guess[i] + 1) % VOCAB
    out = srv.generate(prompt, NEW, drafts=guess.tolist(), k=k)
    assert np.array_equal(out.tokens, tokens)
    assert np.array_equal(out.logits, logits[out.cached_tokens:])
    assert out.proposed > 0 and out.accepted <= out.proposed
    assert check_invariants(srv.manager) == []


def test_broken_variant_drafting_into_the_working_state_is_caught() -> None:
    """A step that writes its state into the working pages leaves a rejected draft's state behind."""
    srv = server(in_place=True)
    prompt = BASE[:20]
    tokens, logits = greedy(prompt)
    guess = tokens.copy()
    guess[3] = (guess[3] + 1) % VOCAB  # the fourth guess is wrong: the step keeps three of four
    out = srv.generate(prompt, NEW, drafts=guess.tolist(), k=4)
    assert not np.array_equal(out.logits, logits[out.cached_tokens:])


def tiered(directory: Path, *, host_bytes: int = 1 << 20, executor: RefExecutor | None = None) -> HybridServer:
    manager = CacheManager(Layout.from_preset("tiny_linear"),
                           ManagerConfig(default_pool_pages=64, retain_every_blocks=1, key_seed=2))
    return HybridServer(model(), manager, executor or RefExecutor(),
                        tiers=TierOptions(directory=directory, host_bytes=host_bytes, policy="load"))


@pytest.mark.parametrize("host_bytes", [1 << 20, 0])  # host and disk, or disk alone
def test_hits_from_the_tiers_and_after_a_restart_equal_recompute(tmp_path: Path, host_bytes: int) -> None:
    """Every block and kept point (the recurrent state with it) is stored as it is computed; after the device
    dropped everything, and in a new server on the same directory, the tiers serve the prefix exactly."""
    srv = tiered(tmp_path, host_bytes=host_bytes)
    srv.prefill(BASE, chunk_tokens=5)
    assert srv.tiers is not None
    srv.tiers.cache.drain()  # every disk write settled (a record is served only once durable)
    srv.manager.evict()  # the device keeps nothing
    prompt = BASE[:35] + (1, 2)
    served = srv.prefill(prompt)
    assert (served.cached_tokens, served.tier_tokens) == (32, 32)
    assert np.array_equal(served.logits, recompute(prompt)[32:])
    srv.close()
    again = tiered(tmp_path, host_bytes=host_bytes)  # a restart: an empty device, the same disk
    prompt = BASE[:44] + (9,)
    served = again.prefill(prompt, chunk_tokens=3)
    assert served.cached_tokens == 40 and served.tier_tokens == 40
    assert np.array_equal(served.logits, recompute(prompt)[40:])
    assert check_invariants(again.manager) == []
    again.close()


def test_broken_variant_point_records_without_the_state_is_caught(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Point records that carry no recurrent state (as managers that offload only per-token KV): a prefix
    loaded from the tiers resumes from a state that is not the prompt's, and the oracle sees it."""
    original = PoolSpec.point_entries

    def without_state(self: PoolSpec, prefix_tokens: int) -> int:
        return 0 if self.object_kind is ObjectKind.RECURRENT_STATE else original(self, prefix_tokens)

    monkeypatch.setattr(PoolSpec, "point_entries", without_state)
    srv = tiered(tmp_path)
    srv.prefill(tuple(range(40)))  # another prompt first: the pages hold its state
    srv.prefill(BASE)
    srv.manager.evict()
    prompt = BASE[:35] + (1, 2)
    served = srv.prefill(prompt)
    assert served.tier_tokens == 32
    assert not np.array_equal(served.logits, recompute(prompt)[32:])
    srv.close()


def test_a_failed_tier_load_after_a_device_hit_is_recomputed_exactly(tmp_path: Path,
                                                                     failing_loads: RefExecutor) -> None:
    """A device hit at 16, then a tier load of [16, 32) whose plan fails after scribbling over the working
    state: the allocation is recomputed from the hit's state, never from what the failed copy left."""
    srv = tiered(tmp_path, executor=failing_loads)
    srv.prefill(BASE)
    rid = srv.manager.add_request(np.array(BASE[:17]))  # pin the point at 16 while the rest is evicted
    srv.manager.acquire(rid, srv.manager.match(rid))
    srv.manager.evict()
    srv.manager.release(rid)
    prompt = BASE[:35] + (1, 2)
    served = srv.prefill(prompt)
    assert srv.tiers is not None and srv.tiers.cache.counts["load_failed"] == 1
    assert served.cached_tokens == 16 and served.tier_tokens == 0
    assert np.array_equal(served.logits, recompute(prompt)[16:])
    srv.close()
