"""The batch-invariant indexer scoring: a (query, key) score has the same bits whatever else is in the call.

(It does not close the gap between chunked and one-shot prefill on its own - benchmarks/bench_hf_gap.py and
docs/hf.md: HF's projections and attention also round differently by call shape, and those differences flip
the indexer's near-ties.)
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the hf extra (transformers, torch) is not installed")
pytest.importorskip("transformers", reason="the hf extra (transformers, torch) is not installed")

from hkv_exec_ref.hf import HfEngine  # noqa: E402
from hkv_exec_ref.hf.invariant import batch_invariant_scores, install_batch_invariant_indexer  # noqa: E402


def scorer() -> object:
    engine = HfEngine.tiny("deepseek_v4", 0)
    return next(m for m in engine.model.hf.modules() if type(m).__name__ == "DeepseekV4IndexerScorer")


def test_a_score_does_not_depend_on_the_other_queries_and_keys() -> None:
    s = scorer()
    gen = torch.Generator().manual_seed(0)
    q, keys, hidden = torch.randn(1, 37, 2, 8, generator=gen), torch.randn(1, 29, 8, generator=gen), \
        torch.randn(1, 37, 64, generator=gen)
    full = batch_invariant_scores(s, q, keys, hidden)
    for lo, hi, t in ((0, 1, 29), (5, 18, 11), (36, 37, 1), (0, 37, 3)):
        part = batch_invariant_scores(s, q[:, lo:hi], keys[:, :t], hidden[:, lo:hi])
        assert torch.equal(part, full[:, lo:hi, :t]), (lo, hi, t)
    stock = type(s).forward(s, q, keys, hidden)
    assert torch.allclose(full, stock, rtol=1e-5, atol=1e-6), "not the same formula"


def test_install_replaces_every_csa_scorer_and_serving_stays_exact() -> None:
    engine = HfEngine.tiny("deepseek_v4", 0, retain_every_blocks=1)
    assert install_batch_invariant_indexer(engine.model.hf) == 1  # one CSA layer in the tiny model
    prompt = torch.randint(0, 64, (50,), generator=torch.Generator().manual_seed(1)).numpy()
    engine.generate(prompt, 1)
    served = engine.generate(prompt[:45], 2)
    assert served.cached_tokens == 40 and engine.matches_recompute(prompt[:45], served)
