"""One tiny V4 layer over a chunk of tokens, reading earlier positions only from its state.

Per token (docs/v4_cache.md sections 2-4): h = RMSNorm(x); query latent qr = RMSNorm(h @ W_qa);
q = RoPE_t(qr @ W_qb); one latent kv = RoPE_t(RMSNorm(h @ W_kv)) used as K and V;
compressors emit every block completed in the chunk; each query attends (attention.py);
the rope part of the output is de-rotated by -t; residual; then a per-token gated FFN
(standing in for the MoE, which holds no cross-token state).
"""

from __future__ import annotations

import attrs
import numpy as np

from hkv_exec_ref.tiny_v4.attention import (
    IndexQuery,
    Probe,
    Selection,
    attend,
    compressed_set,
    visible_entries,
    window_rows,
)
from hkv_exec_ref.tiny_v4.compressor import advance
from hkv_exec_ref.tiny_v4.config import Config, LayerSpec
from hkv_exec_ref.tiny_v4.indexer import index_queries
from hkv_exec_ref.tiny_v4.numerics import F32, I64, RopeTable, proj, rms_norm, xp_of
from hkv_exec_ref.tiny_v4.state import LayerState
from hkv_exec_ref.tiny_v4.weights import LayerWeights


@attrs.frozen(kw_only=True)
class LayerContext:
    """Everything constant about one layer: sizes, kind, weights, rope tables."""

    index: int
    cfg: Config
    spec: LayerSpec
    weights: LayerWeights
    rope: RopeTable  # rope_dims of head_dim, for q, kv and K_j
    index_rope: RopeTable  # index_rope_dims of index_dim, for qI and KI_j


def _compress(ctx: LayerContext, state: LayerState, h: F32, positions: I64, kv: F32) -> LayerState:
    """The state extended by the chunk: window rows, tail rows and emitted entries."""
    eps, lw = ctx.cfg.norm_eps, ctx.weights
    out = attrs.evolve(state, window=np.concatenate([state.window, kv]))
    if lw.compressor is not None and state.tail is not None:
        tail, new = advance(state.tail, h, positions, lw.compressor, ctx.spec, ctx.rope, eps)
        out = attrs.evolve(out, tail=tail, entries=np.concatenate([state.entries, new]))
    if lw.indexer is not None and state.index_tail is not None and state.index_keys is not None:
        iw = lw.indexer.compressor
        tail, new = advance(state.index_tail, h, positions, iw, ctx.spec, ctx.index_rope, eps)
        out = attrs.evolve(out, index_tail=tail, index_keys=np.concatenate([state.index_keys, new]))
    return out


def _index_views(
    ctx: LayerContext, state: LayerState, qr: F32, h: F32, positions: I64
) -> list[IndexQuery | None]:
    """The lightning indexer's inputs for each query of the chunk (CSA only, else None)."""
    iw, cfg, keys = ctx.weights.indexer, ctx.cfg, state.index_keys
    if iw is None or keys is None:
        return [None] * positions.shape[0]
    q_index, weights = index_queries(qr, h, positions, iw, ctx.index_rope, cfg.index_heads)
    topk = cfg.index_topk
    return [
        IndexQuery(q_index=q_index[i], weights=weights[i], keys=keys, topk=topk)
        for i in range(positions.shape[0])
    ]


def _record(probe: Probe | None, ctx: LayerContext, position: int, chosen: I64) -> None:
    if probe is None or not ctx.spec.ratio:
        return
    visible = visible_entries(position, ctx.spec.ratio)
    selected = tuple(chosen.tolist())
    probe.selections.append(
        Selection(layer=ctx.index, position=position, visible=visible, selected=selected)
    )


def _queries(
    ctx: LayerContext,
    state: LayerState,
    q: F32,
    index_views: list[IndexQuery | None],
    positions: I64,
    probe: Probe | None,
) -> F32:
    """Attention output of every query of the chunk, each by the canonical per-query path."""
    outs = []
    for i, t in enumerate(positions.tolist()):
        chosen = compressed_set(t, ctx.spec.ratio, index_views[i])
        window = window_rows(t, ctx.cfg.window_tokens, state.window, state.window_start)
        picked = state.entries[xp_of(state.entries).asarray(chosen)]
        outs.append(attend(q[i], np.concatenate([window, picked]), ctx.weights.sink))
        _record(probe, ctx, t, chosen)
    assert len(outs) == positions.shape[0]
    return np.stack(outs)


def _ffn(lw: LayerWeights, x: F32, eps: float) -> F32:
    h = rms_norm(x, lw.ffn_norm, eps)
    return proj(np.maximum(proj(h, lw.w_gate), np.float32(0.0)) * proj(h, lw.w_up), lw.w_down)


def layer_forward(
    ctx: LayerContext, x: F32, positions: I64, state: LayerState, probe: Probe | None
) -> tuple[F32, LayerState]:
    """Run the chunk at `positions` (P .. P+n-1) through the layer given its state at P.

    Returns the residual stream after the layer and the state EXTENDED to P+n (every row
    it was given plus the chunk's; the caller cuts it to the minimal resume state).
    """
    cfg, lw, eps = ctx.cfg, ctx.weights, ctx.cfg.norm_eps
    n, heads, dim = x.shape[0], cfg.n_heads, cfg.head_dim
    assert state.window_start + state.window.shape[0] == int(positions[0]), "window must end at P"
    h = rms_norm(x, lw.attn_norm, eps)
    qr = rms_norm(proj(h, lw.w_qa), lw.q_norm, eps)
    q = ctx.rope.apply(proj(qr, lw.w_qb).reshape(n, heads, dim), positions)
    kv = ctx.rope.apply(rms_norm(proj(h, lw.w_kv), lw.kv_norm, eps), positions)
    extended = _compress(ctx, state, h, positions, kv)
    index_views = _index_views(ctx, extended, qr, h, positions)
    attn = _queries(ctx, extended, q, index_views, positions, probe)
    attn = ctx.rope.apply(attn, positions, inverse=True).reshape(n, heads * dim)
    x = x + proj(attn, lw.w_o)
    x = x + _ffn(lw, x, eps)
    assert x.dtype == np.float32 and extended.window.shape[0] == state.window.shape[0] + n
    return x, extended
