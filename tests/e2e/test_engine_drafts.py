"""Speculative serving equals recomputation bit for bit (docs/drafts.md), and the check is able to fail.

TinyV4 decodes through the cache with drafts of every length 1..8 and every
acceptance pattern (none, all, partial, seeded random): tokens and logits are
np.array_equal to a run without any cache, whatever prefix hits, evictions
and other requests publishing the same prefix come between; the hit rate is
the same with speculation as without; everything a step reserved comes back.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hkv_core.errors import InvalidArgument
from hkv_core.manager import check_invariants
from hkv_core.manager.roles import TailRole
from hkv_exec_ref import DraftSpec, Engine
from hkv_exec_ref.demo import WorkloadConfig, run_demo

BASE = np.random.default_rng(77).integers(0, 64, 80)
LIMITS = {"default_pool_pages": 96, "retain_every_blocks": 1, "debug_checks": True}


def exact(engine: Engine, prompt: np.ndarray, new: int, draft: DraftSpec | None) -> tuple[int, int]:
    served = engine.generate(prompt, new, draft=draft)
    assert engine.matches_recompute(prompt, served), (len(prompt), new, draft)
    return served.proposed_tokens, served.accepted_tokens


@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("probability", [0.0, 0.5, 1.0])
def test_every_draft_length_and_acceptance_pattern_is_exact(k: int, probability: float) -> None:
    engine = Engine.tiny(check_states=True, **LIMITS)
    proposed = accepted = 0
    for i, cut in enumerate((13, 29, 29, 44, 61)):  # repeats and extensions of one prefix: hits at many points
        got = exact(engine, BASE[:cut], 24, DraftSpec(k=k, accept_probability=probability, seed=i))
        proposed, accepted = proposed + got[0], accepted + got[1]
    assert proposed > 0
    if probability == 0.0:
        assert accepted == 0
    if probability == 1.0:
        assert accepted == proposed  # every step accepts all k (and the target's token after them)
    assert check_invariants(engine.manager) == []


@settings(max_examples=25)
@given(st.lists(st.tuples(st.integers(1, 80), st.integers(0, 20), st.integers(1, 8),
                          st.sampled_from([0.0, 0.3, 0.7, 1.0]), st.integers(0, 3), st.booleans()),
                min_size=1, max_size=6))
def test_random_workloads_with_drafts_are_exact(requests: list[tuple[int, int, int, float, int, bool]]) -> None:
    """Any mix of prompts sharing a prefix, decode lengths, drafts, acceptance rates, plain decoding between
    and evictions: every response equals recomputation."""
    engine = Engine.tiny(check_states=True, **LIMITS)
    for cut, new, k, probability, seed, evict in requests:
        draft = DraftSpec(k=k, accept_probability=probability, seed=seed) if seed else None
        exact(engine, BASE[:cut], new, draft)
        if evict:
            engine.evict()


def test_hit_rate_with_speculation_equals_without() -> None:
    """What a speculating request publishes at L is what match returns at L (F7): the same hits as without."""
    cfg = WorkloadConfig(requests=24, seed=3)
    plain = run_demo(cfg)
    drafting = run_demo(cfg, draft=DraftSpec(k=4, accept_probability=0.6, seed=3))
    assert plain.ok and drafting.ok
    assert [r.cached_tokens for r in drafting.rows] == [r.cached_tokens for r in plain.rows]
    assert drafting.proposed_tokens > drafting.accepted_tokens > 0


def test_drafted_continuation_already_cached() -> None:
    """A request whose drafts (right or wrong) continue a prefix another request published serves exactly (the
    state machine also runs such a request while a step is in flight: hkv_core.testing.draft_rules)."""
    engine = Engine.tiny(check_states=True, **LIMITS)
    truth = engine.recompute(BASE[:30], 12).tokens
    exact(engine, np.concatenate([BASE[:30], truth]), 4, None)  # the continuation is cached already
    exact(engine, BASE[:30], 12, DraftSpec(k=5, accept_probability=0.5, seed=1))
    exact(engine, BASE[:30], 12, DraftSpec(k=8, accept_probability=1.0, seed=2))


def test_draft_spec_is_checked() -> None:
    for bad in ({"k": 0}, {"k": 17}, {"k": 2.0}, {"k": 2, "accept_probability": 1.5},
                {"k": 2, "accept_probability": "high"}, {"k": 2, "seed": -1}):
        with pytest.raises(InvalidArgument):
            DraftSpec(**bad)
    with pytest.raises(InvalidArgument):
        Engine.tiny().generate(BASE[:10], 3, draft=4)  # type: ignore[arg-type]


def test_oracle_catches_a_step_that_resumes_from_the_wrong_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: accept takes the step's last tail page as the working tail, whatever was accepted."""
    real = TailRole.settle_draft

    def last_page(self: TailRole, req: object, draft: object, end: int, moves: object) -> None:
        real(self, req, draft, draft.end if end > draft.start else end, moves)  # type: ignore[attr-defined, arg-type]

    monkeypatch.setattr(TailRole, "settle_draft", last_page)
    engine = Engine.tiny(**LIMITS | {"debug_checks": False})
    results = [engine.generate(BASE[:cut], 24, draft=DraftSpec(k=8, accept_probability=0.5, seed=cut))
               for cut in (13, 29, 44)]
    assert not all(engine.matches_recompute(BASE[:cut], r) for cut, r in zip((13, 29, 44), results, strict=True))
