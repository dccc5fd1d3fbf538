"""Lightning indexer of CSA layers (docs/v4_cache.md section 3).

Scores every visible indexer key KI_j for one query with ReLU-gated, weighted per-head
dot products and keeps the top-min(k, visible) entries: sorted by (-score, index), the
first k taken, then returned in ascending index order.
"""

from __future__ import annotations

import numpy as np

from hkv_exec_ref.tiny_v4.numerics import F32, I64, RopeTable, proj, xp_of
from hkv_exec_ref.tiny_v4.weights import IndexerWeights


def index_queries(
    qr: F32, h: F32, positions: I64, iw: IndexerWeights, rope: RopeTable, index_heads: int
) -> tuple[F32, F32]:
    """qI_t = RoPE_t(qr_t @ W_qI) per head, and w_t = (x_t @ W_w) / sqrt(dim * heads)."""
    n = qr.shape[0]
    index_dim = iw.w_q.shape[1] // index_heads
    assert iw.w_q.shape[1] == index_heads * index_dim and h.shape[0] == n, (iw.w_q.shape, n)
    q_index = rope.apply(proj(qr, iw.w_q).reshape(n, index_heads, index_dim), positions)
    scale = np.float32(index_dim**-0.5 * index_heads**-0.5)
    weights = proj(h, iw.w_weights) * scale
    return q_index, weights


def index_scores(q_index: F32, weights: F32, keys: F32) -> F32:
    """score_j = sum_h w_h * ReLU(qI_h . KI_j), reductions in fixed index order."""
    assert q_index.shape[0] == weights.shape[0] and q_index.shape[1] == keys.shape[1]
    dots = proj(keys, q_index.T)  # (n_visible, heads)
    return proj(np.maximum(dots, np.float32(0.0)), weights[:, None])[:, 0]


def select_entries(q_index: F32, weights: F32, keys: F32, topk: int) -> I64:
    """Indices of the top-min(k, visible) keys, ties to the lower index, ascending.

    A stable sort of -score (+ 0.0, so that -0.0 and 0.0 are one key on every backend) keeps equal scores in
    index order."""
    visible = keys.shape[0]
    scores = index_scores(q_index, weights, keys)
    order = xp_of(scores).argsort(-scores + np.float32(0.0), kind="stable")
    chosen = np.sort(order[: min(topk, visible)]).astype(np.int64)
    assert chosen.shape[0] == min(topk, visible)
    return chosen
