"""The batch-invariant lightning indexer: fixed-order scores and a stable top-k.

A (query, key) score has the same bits whatever else is in the call, and with the hook installed chunked
(served) and one-shot prefill differ only by float rounding (< 1e-6, no greedy token differs), where HF's own
indexer moves logits by more than 0.01 (docs/hf.md).
"""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch", reason="the hf extra (transformers, torch) is not installed")
pytest.importorskip("transformers", reason="the hf extra (transformers, torch) is not installed")

from hkv_exec_ref.hf import HfEngine  # noqa: E402
from hkv_exec_ref.hf.invariant import (  # noqa: E402
    batch_invariant_scores,
    install_batch_invariant_indexer,
    stable_topk,
)


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


def test_stable_topk_breaks_ties_toward_the_lower_index_whatever_the_length() -> None:
    row = torch.tensor([0.0, 3.0, 0.0, 3.0, 0.0, float("-inf"), 0.0])
    assert stable_topk(row, 3).indices.tolist() == [1, 3, 0]
    assert stable_topk(row[:5], 3).indices.tolist() == [1, 3, 0]
    assert stable_topk(row, 5, largest=False).indices.tolist() == [5, 0, 2, 4, 6]


def gap(installed: bool) -> tuple[float, float]:
    engine = HfEngine.tiny("deepseek_v4", 0, index_topk=2, retain_every_blocks=1)
    if installed:
        install_batch_invariant_indexer(engine.model.hf)
    prompt = torch.randint(0, 64, (96,), generator=torch.Generator().manual_seed(1)).numpy()
    served, one_shot = engine.generate(prompt, 1), engine.recompute(prompt, 1)
    assert engine.matches_recompute(prompt, served)
    diff = abs(served.prompt_logits - one_shot.prompt_logits).max()
    flips = (served.prompt_logits.argmax(1) != one_shot.prompt_logits.argmax(1)).mean()
    return float(diff), float(flips)


def test_the_hook_closes_the_gap_to_one_shot_prefill_up_to_rounding() -> None:
    assert gap(installed=False)[0] > 1e-2
    diff, flips = gap(installed=True)
    assert diff < 1e-6 and flips == 0.0


def test_install_replaces_every_csa_indexer_and_serving_stays_exact() -> None:
    engine = HfEngine.tiny("deepseek_v4", 0, retain_every_blocks=1)
    assert install_batch_invariant_indexer(engine.model.hf) == 1  # one CSA layer in the tiny model
    prompt = torch.randint(0, 64, (50,), generator=torch.Generator().manual_seed(1)).numpy()
    engine.generate(prompt, 1)
    served = engine.generate(prompt[:45], 2)
    assert served.cached_tokens == 40 and engine.matches_recompute(prompt[:45], served)


def test_installing_twice_is_the_same_as_once() -> None:
    engine = HfEngine.tiny("deepseek_v4", 0)
    assert install_batch_invariant_indexer(engine.model.hf) == install_batch_invariant_indexer(engine.model.hf) == 1
    done: list[bool] = []
    prompt = torch.randint(0, 64, (30,), generator=torch.Generator().manual_seed(2)).numpy()
    worker = threading.Thread(target=lambda: done.append(engine.matches_recompute(prompt, engine.generate(prompt, 2))),
                              daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert done == [True], "serving hung or differed after a second install"
