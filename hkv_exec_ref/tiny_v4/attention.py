"""The canonical per-query attention of every layer kind (docs/v4_cache.md sections 4 and 5).

One query at absolute position t reads

    keys(t) = [kv_u for u in max(0, t-W+1) .. t]  ++  compressed set(t)

(window ascending, then compressed entries ascending, not de-duplicated). The compressed
set is empty for SWA, the indexer's top-k of the visible entries for CSA and every
visible entry for HCA; entry j is visible iff (j+1)*r - 1 <= t. The same function runs
for a query whether it came from a long prefill or from a decode step after a resume,
and its array shapes depend only on t, so its bits do too.
"""

from __future__ import annotations

import attrs
import numpy as np

from hkv_exec_ref.tiny_v4.indexer import select_entries
from hkv_exec_ref.tiny_v4.numerics import F32, I64, exp32, proj, seq_sum


@attrs.frozen(kw_only=True)
class Selection:
    """Which compressed entries one query of one layer attended to."""

    layer: int
    position: int
    visible: int  # entries j with (j+1)*r - 1 <= t
    selected: tuple[int, ...]  # ascending


@attrs.define
class Probe:
    """Optional recorder passed to forward passes; tests read the CSA/HCA selections."""

    selections: list[Selection] = attrs.Factory(list)


def visible_entries(position: int, ratio: int) -> int:
    """How many compressed entries query `position` may read (section 5)."""
    assert ratio > 0 and position >= 0, (ratio, position)
    return (position + 1) // ratio


@attrs.frozen(kw_only=True)
class IndexQuery:
    """The lightning indexer's view of one query (section 3)."""

    q_index: F32  # (index_heads, index_dim), roped at t
    weights: F32  # (index_heads,)
    keys: F32  # (n_entries >= visible, index_dim): KI_j of the layer
    topk: int


def compressed_set(position: int, ratio: int, index: IndexQuery | None) -> I64:
    """Ascending entry indices query `position` attends to: all visible (HCA) or top-k (CSA)."""
    if ratio == 0:
        return np.zeros(0, dtype=np.int64)
    visible = visible_entries(position, ratio)
    if index is None:
        return np.arange(visible, dtype=np.int64)
    assert index.keys.shape[0] >= visible, (index.keys.shape, visible)
    return select_entries(index.q_index, index.weights, index.keys[:visible], index.topk)


def window_rows(position: int, window_tokens: int, rows: F32, rows_start: int) -> F32:
    """kv of positions max(0, t-W+1) .. t, from rows holding [rows_start, ...)."""
    lo = max(0, position - window_tokens + 1)
    assert rows_start <= lo and position < rows_start + rows.shape[0], (rows_start, lo, position)
    return rows[lo - rows_start : position - rows_start + 1]


def attend(q: F32, keys: F32, sink: F32) -> F32:
    """Softmax attention of one query (heads, D) over keys (n, D) that are also the values.

    logits = q . k / sqrt(D); the sink adds exp(s_h - m) to the denominator only, m being
    the max over real keys. Returns (heads, D), still carrying rope (the caller de-rotates
    it by -t, layer.py).
    """
    assert keys.ndim == 2 and keys.shape[0] >= 1 and keys.shape[1] == q.shape[1], keys.shape
    scale = np.float32(1.0 / np.sqrt(q.shape[1]))
    logits = proj(keys, q.T) * scale  # (n, heads)
    peak = logits.max(axis=0)
    probs = exp32(logits - peak)
    denom = seq_sum(probs, axis=0) + exp32(sink - peak)
    mixed = seq_sum(probs[:, :, None] * keys[:, None, :], axis=0)
    return mixed / denom[:, None]
