"""A batch-invariant lightning indexer for transformers' DeepSeek-V4, installed as a hook (docs/hf.md).

The same prompt gives different outputs prefilled in one call or in chunks (a prefix cache makes chunks), by up
to 0.1 in the logits whenever `index_topk` is below the number of compressed entries.  The cause is the top-k:
ReLU-gated scores tie exactly (at 0, and -inf for entries a query may not see), and `torch.topk` breaks ties in
an order that depends on the length of the score row - which is the call's number of entries.
`install_batch_invariant_indexer(model)` fixes both halves of the indexer for every CSA layer:

- scoring: the same formula computed in a fixed order for each (query, key) pair - every dot product and sum a
  strictly sequential loop of element-wise multiply-adds, whatever the call's shape;
- selection: a stable top-k, ties to the lower entry index (hkv's own rule, docs/v4_cache.md), by wrapping the
  indexer's forward so that `Tensor.topk` is the stable version while it runs.

With it the chunked and one-shot outputs differ only by float rounding (about 2e-7: CPU kernels round by the
tensor's shape - matrix-product blocking, and vectorized versus scalar loops for short tensors).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["batch_invariant_scores", "install_batch_invariant_indexer", "sequential_sum", "stable_topk"]


def sequential_sum(terms: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum along `dim` in index order, ((t0 + t1) + t2) + ..., as element-wise adds (shape-independent bits)."""
    total = terms.select(dim, 0).clone()
    for i in range(1, terms.shape[dim]):
        total = total + terms.select(dim, i)
    return total


def batch_invariant_scores(scorer: Any, q: torch.Tensor, compressed_kv: torch.Tensor,
                           hidden_states: torch.Tensor) -> torch.Tensor:
    """`sum_h w_h * ReLU(q_h . k) * scale` for queries q [B, S, H, D] and keys [B, T, D]: [B, S, T]."""
    products = q.float()[:, :, :, None, :] * compressed_kv.float()[:, None, None, :, :]  # [B, S, H, T, D]
    scores = F.relu(sequential_sum(products, -1)) * scorer.softmax_scale
    weight = scorer.weights_proj.weight.float()  # [H, hidden]
    weights = sequential_sum(hidden_states.float()[:, :, None, :] * weight[None, None], -1)  # [B, S, H]
    return sequential_sum(scores * (weights * scorer.weights_scaling)[..., None], 2)


def stable_topk(values: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
    """`Tensor.topk` with ties broken toward the lower index along `dim` (a stable sort), for any row length."""
    ordered, index = torch.sort(values, dim=dim, descending=largest, stable=True)
    return torch.return_types.topk((ordered.narrow(dim, 0, k), index.narrow(dim, 0, k)))


_TOPK_LOCK = threading.RLock()  # Tensor.topk is swapped process-wide while an indexer runs (other threads wait)


@contextlib.contextmanager
def _stable_topk() -> Iterator[None]:
    with _TOPK_LOCK:
        saved = torch.Tensor.topk
        torch.Tensor.topk = stable_topk  # type: ignore[method-assign, assignment]
        try:
            yield
        finally:
            torch.Tensor.topk = saved  # type: ignore[method-assign]  # nested: restores the stable one


def _with_stable_topk(forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        with _stable_topk():
            return forward(*args, **kwargs)
    run.hkv_stable_topk = True  # type: ignore[attr-defined]  # installed: a second install leaves it as it is
    return run


def install_batch_invariant_indexer(model: Any) -> int:
    """Make the lightning indexer of every CSA layer of `model` batch-invariant (fixed-order scoring, stable
    top-k); the number of indexers changed."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Indexer

    count = 0
    for module in model.modules():
        if isinstance(module, DeepseekV4Indexer):
            module.scorer.forward = types.MethodType(batch_invariant_scores, module.scorer)  # type: ignore[method-assign]
            if not getattr(module.forward, "hkv_stable_topk", False):
                module.forward = _with_stable_topk(module.forward)  # type: ignore[method-assign]
            count += 1
    return count
