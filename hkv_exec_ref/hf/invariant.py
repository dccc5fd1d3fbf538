"""A batch-invariant lightning-indexer scoring for transformers' DeepSeek-V4, installed as a hook (docs/hf.md).

HF scores a call's queries against the compressed indexer keys with matrix products whose shapes depend on how
many queries and keys the call has; the roundings differ with the shapes, and the indexer's top-k flips on
near-ties - so the same prompt gives different outputs prefilled in one call or in chunks (a prefix cache
makes chunks).  `install_batch_invariant_indexer(model)` replaces every `DeepseekV4IndexerScorer.forward` with
the same formula computed in a fixed order for each (query, key) pair: every dot product and every sum a
strictly sequential loop of element-wise multiply-adds, whatever the call's shape.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["batch_invariant_scores", "install_batch_invariant_indexer", "sequential_sum"]


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


def install_batch_invariant_indexer(model: Any) -> int:
    """Replace the indexer scoring of every CSA layer of `model`; the number of scorers replaced."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4IndexerScorer

    count = 0
    for module in model.modules():
        if isinstance(module, DeepseekV4IndexerScorer):
            module.forward = types.MethodType(batch_invariant_scores, module)
            count += 1
    return count
