"""Exactness oracle of tiny V4 (docs/v4_cache.md sections 6 and 7).

Resuming from the MINIMAL state at any prefix length P and feeding the rest in any
chunking gives logits np.array_equal to full recomputation; every piece of that state is
needed (each fault switch breaks it exactly where the piece exists).
"""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hkv_exec_ref.tiny_v4 import (
    Config,
    Fault,
    ModelState,
    Probe,
    TinyV4,
    expected_sizes,
    inject,
    state_problems,
)
from hkv_exec_ref.tiny_v4.numerics import F32, RopeTable, exp32, proj, rms_norm, seq_sum

MODEL = TinyV4()
CFG = MODEL.config
TOKENS = np.random.default_rng(1234).integers(0, CFG.vocab, size=56)
FULL = MODEL.recompute(TOKENS)
PREFIXES = range(49)  # every residue class mod 4 and mod 8, several windows of W = 8
CHUNKS = (1, 3, 5, None)  # None = the whole rest in one chunk


@functools.cache
def state_at(p: int) -> ModelState:
    return MODEL.state_at(TOKENS, p)


def feed(
    state: ModelState, tokens: np.ndarray, chunk: int | None, **kw: object
) -> tuple[F32, ModelState]:
    """Feed `tokens` from `state` in chunks of `chunk`; return all logits and the final state."""
    step = chunk or len(tokens)
    outs = []
    for lo in range(0, len(tokens), step):
        logits, state = MODEL.forward(tokens[lo : lo + step], state, **kw)  # type: ignore[arg-type]
        outs.append(logits)
    return np.concatenate(outs), state


def assert_states_equal(a: ModelState, b: ModelState) -> None:
    assert a.prefix_tokens == b.prefix_tokens
    for la, lb in zip(a.layers, b.layers, strict=True):
        assert la.spec == lb.spec and la.window_start == lb.window_start
        for name in ("window", "entries", "index_keys"):
            xa, xb = getattr(la, name), getattr(lb, name)
            assert (xa is None) == (xb is None) and (xa is None or np.array_equal(xa, xb)), name
        for name in ("tail", "index_tail"):
            ta, tb = getattr(la, name), getattr(lb, name)
            assert (ta is None) == (tb is None), name
            if ta is not None:
                assert ta.start == tb.start and np.array_equal(ta.a, tb.a), name
                assert np.array_equal(ta.z, tb.z), name


def test_default_config_is_the_tiny_v4_preset() -> None:
    preset = Path(__file__).parents[2] / "specs" / "presets" / "tiny_v4.toml"
    hf = tomllib.loads(preset.read_text())
    assert Config.from_hf_config(hf) == Config()


# --- the canonical primitives are independent of batch shape ---------------------------


def test_proj_rows_are_batch_independent_and_canonical() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 24)).astype(np.float32)
    x = rng.standard_normal((37, 32)).astype(np.float32)
    full = proj(x, w)
    loop = x[:, 0:1] * w[0]
    for i in range(1, 32):
        loop = loop + x[:, i : i + 1] * w[i]  # the explicit in-order accumulation
    assert np.array_equal(full, loop)
    assert np.array_equal(seq_sum(x, axis=1), functools.reduce(np.add, x.T))
    for i in range(37):
        assert np.array_equal(full[i], proj(x[i : i + 1], w)[0])
        assert np.array_equal(full[i], (x[i][:, None] * w).sum(0))  # section 7's form
    assert np.array_equal(full[5:20], proj(x[5:20], w))


def test_norm_rope_exp_are_batch_independent() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((41, 2, 16)).astype(np.float32)
    gain = rng.standard_normal(16).astype(np.float32)
    pos = rng.integers(0, 4096, 41)
    rope = RopeTable(dims=8, base=160000.0, max_positions=4096)
    normed, rotated, expo = rms_norm(x, gain, 1e-6), rope.apply(x, pos), exp32(x)
    for i in (0, 7, 40):
        assert np.array_equal(normed[i], rms_norm(x[i : i + 1], gain, 1e-6)[0])
        assert np.array_equal(rotated[i], rope.apply(x[i : i + 1], pos[i : i + 1])[0])
        assert np.array_equal(expo[i], exp32(x[i]))
    assert np.array_equal(expo[3:30], exp32(x[3:30]))
    back = rope.apply(rotated, pos, inverse=True)
    assert np.allclose(back, x, atol=1e-5)


# --- the minimal state is exactly section 6's -------------------------------------------


@pytest.mark.parametrize("p", PREFIXES)
def test_state_at_is_minimal(p: int) -> None:
    state = state_at(p)
    assert state.prefix_tokens == p
    assert state.sizes() == expected_sizes(CFG, p)
    assert state_problems(state, CFG) == []
    csa = state.layers[1]
    assert csa.tail is not None and csa.tail.a.shape[0] == 4 + p % 4
    assert state.layers[2].tail is not None and state.layers[2].tail.a.shape[0] == p % 8
    assert state.layers[0].window.shape[0] == min(p, CFG.window_tokens - 1)


@pytest.mark.parametrize("p", range(1, 49, 5))
def test_forward_emits_the_same_minimal_state(p: int) -> None:
    _, state = MODEL.forward(TOKENS[:p], MODEL.empty_state())
    assert_states_equal(state, state_at(p))


# --- resume from the minimal state == recompute, bit for bit ----------------------------


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("p", PREFIXES)
def test_resume_equals_recompute(p: int, chunk: int | None) -> None:
    given_state = state_at(p).copy()
    logits, final = feed(state_at(p), TOKENS[p:], chunk)
    assert np.array_equal(logits, FULL[p:])
    assert_states_equal(final, state_at(len(TOKENS)))
    assert_states_equal(state_at(p), given_state)  # the given state was not written


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_random_prompts_and_chunkings(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 40), label="n")
    tokens = np.array(data.draw(st.lists(st.integers(0, CFG.vocab - 1), min_size=n, max_size=n)))
    p = data.draw(st.integers(0, n - 1), label="p")
    drawn = data.draw(st.lists(st.integers(1, n), max_size=6), label="cuts")
    cuts = sorted({c for c in drawn if c < n})
    bounds = [0, *cuts, n]
    full = MODEL.recompute(tokens)
    state, outs = MODEL.empty_state(), []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        logits, state = MODEL.forward(tokens[lo:hi], state)
        outs.append(logits)
    assert np.array_equal(np.concatenate(outs), full)
    chunk = data.draw(st.integers(1, n - p), label="chunk")
    logits, _ = feed(MODEL.state_at(tokens, p), tokens[p:], chunk)
    assert np.array_equal(logits, full[p:])


@pytest.mark.parametrize("p", [0, 3, 9, 16, 19])
def test_generate_from_state_equals_cold(p: int) -> None:
    prompt_end = 20
    cold = MODEL.generate(TOKENS[:prompt_end], 12)
    warm = MODEL.generate(TOKENS[p:prompt_end], 12, state_at(p))
    assert np.array_equal(warm.tokens, cold.tokens)
    whole = np.concatenate([TOKENS[:prompt_end], cold.tokens])
    assert np.array_equal(warm.logits, MODEL.recompute(whole)[p:])
    assert_states_equal(warm.state, MODEL.trace(whole).resume_at(len(whole), CFG))


def test_indexer_top_k_selects_fewer_than_visible() -> None:
    probe = Probe()
    MODEL.trace(TOKENS, probe=probe)
    csa = [s for s in probe.selections if s.layer == 1]
    hca = [s for s in probe.selections if s.layer == 2]
    assert all(len(s.selected) == min(CFG.index_topk, s.visible) for s in csa)
    assert all(list(s.selected) == sorted(s.selected) for s in csa)
    assert sum(len(s.selected) < s.visible for s in csa) >= 40
    latest = [s for s in csa if s.visible > 2 and s.selected != (s.visible - 2, s.visible - 1)]
    assert latest, "the indexer never picks anything but the newest entries"
    assert all(s.selected == tuple(range(s.visible)) for s in hca)


# --- negative tests: each fault switch is caught by the oracle --------------------------


def broken_prefixes(fault: Fault) -> set[int]:
    """Prefix lengths P at which resuming with `fault` changes some logit."""
    out = set()
    for p in PREFIXES:
        logits, _ = feed(state_at(p), TOKENS[p:], None, faults=fault)
        if not np.array_equal(logits, FULL[p:]):
            out.add(p)
    return out


def test_drop_window_row_breaks_every_nonempty_window() -> None:
    assert broken_prefixes(Fault.DROP_WINDOW_ROW) == set(range(1, 49))


def test_drop_tail_breaks_exactly_when_a_block_is_open() -> None:
    # the r = 8 tail has open rows iff P % 8 != 0 (the r = 4 tail's only when P % 4 != 0)
    assert broken_prefixes(Fault.DROP_TAIL) == {p for p in PREFIXES if p % 8}


def test_drop_indexer_keys_breaks_once_an_indexer_key_exists() -> None:
    assert broken_prefixes(Fault.DROP_INDEXER_KEYS) == set(range(4, 49))


def test_drop_overlap_block_breaks_once_block_0_is_closed() -> None:
    broken = broken_prefixes(Fault.DROP_OVERLAP_BLOCK)
    assert broken <= set(range(4, 49))  # before that the overlap rows are padding anyway
    # only K_{floor(P/4)} is wrong; where the logits survive, top-k never picked it
    assert len(broken) >= 40, sorted(set(range(4, 49)) - broken)
    for p in set(range(4, 49)) - broken:
        probe = Probe()
        feed(state_at(p), TOKENS[p:], None, faults=Fault.DROP_OVERLAP_BLOCK, probe=probe)
        assert all(p // 4 not in s.selected for s in probe.selections if s.layer == 1), p


def test_inject_context_manager_equals_per_call_faults() -> None:
    p = 13
    per_call, _ = feed(state_at(p), TOKENS[p:], 3, faults=Fault.DROP_TAIL)
    with inject(Fault.DROP_TAIL):
        in_block, _ = feed(state_at(p), TOKENS[p:], 3)
        with inject(Fault.DROP_WINDOW_ROW):
            both, _ = feed(state_at(p), TOKENS[p:], 3)
    after, _ = feed(state_at(p), TOKENS[p:], 3)
    both_per_call, _ = feed(
        state_at(p), TOKENS[p:], 3, faults=Fault.DROP_TAIL | Fault.DROP_WINDOW_ROW
    )
    assert np.array_equal(per_call, in_block) and not np.array_equal(per_call, FULL[p:])
    assert np.array_equal(both, both_per_call) and not np.array_equal(both, per_call)
    assert np.array_equal(after, FULL[p:])
