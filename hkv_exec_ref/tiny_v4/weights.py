"""Seeded float32 weights of tiny V4 (docs/v4_cache.md sections 2-4).

Drawn from `numpy.random.default_rng(config.seed)` in a fixed order, scaled by
1/sqrt(fan_in) so activations stay O(1). The compressor bias B[t mod r] is drawn large
enough that indexing it by buffer position instead of absolute position would show.
"""

from __future__ import annotations

import attrs
import numpy as np

from hkv_exec_ref.tiny_v4.config import Config, LayerSpec
from hkv_exec_ref.tiny_v4.numerics import F32

BIAS_SCALE = 0.5  # spread of the per-offset gate bias B (section 2)
GAIN_SCALE = 0.1  # spread of RMSNorm gains around 1
SINK_SCALE = 1.0  # spread of the per-head attention sink s_h (section 4)


@attrs.frozen(kw_only=True)
class CompressorWeights:
    """Gated pooling compressor of one layer (section 2): entry width d, overlap c."""

    w_kv: F32  # (hidden, c*d): a_t = x_t @ w_kv
    w_gate: F32  # (hidden, c*d): z_t = x_t @ w_gate + bias[t mod r]
    bias: F32  # (r, c*d)
    norm: F32  # (d,): K_j = RoPE(RMSNorm(C_j) * norm, j*r)


@attrs.frozen(kw_only=True)
class IndexerWeights:
    """Lightning indexer of a CSA layer (section 3)."""

    w_q: F32  # (q_rank, index_heads*index_dim): qI_t = RoPE_t(qr_t @ w_q)
    w_weights: F32  # (hidden, index_heads): w_t = x_t @ w_weights * scale
    compressor: CompressorWeights  # d = index_dim, overlap c = 2


@attrs.frozen(kw_only=True)
class LayerWeights:
    """One transformer layer: attention (section 4) plus a per-token FFN."""

    attn_norm: F32  # (hidden,)
    w_qa: F32  # (hidden, q_rank)
    q_norm: F32  # (q_rank,)
    w_qb: F32  # (q_rank, n_heads*head_dim)
    w_kv: F32  # (hidden, head_dim): the one latent, used as K and V
    kv_norm: F32  # (head_dim,)
    sink: F32  # (n_heads,)
    w_o: F32  # (n_heads*head_dim, hidden)
    ffn_norm: F32  # (hidden,)
    w_gate: F32  # (hidden, ffn_dim)
    w_up: F32  # (hidden, ffn_dim)
    w_down: F32  # (ffn_dim, hidden)
    compressor: CompressorWeights | None  # None for SWA layers
    indexer: IndexerWeights | None  # CSA layers only


@attrs.frozen(kw_only=True)
class Weights:
    """Every weight of a TinyV4 model: embedding, one LayerWeights per layer, final norm."""

    embed: F32  # (vocab, hidden)
    layers: tuple[LayerWeights, ...]
    final_norm: F32  # (hidden,)
    lm_head: F32  # (hidden, vocab)


class _Draw:
    """Fixed-order float32 draws from one seeded generator."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def matrix(self, fan_in: int, fan_out: int) -> F32:
        scale = 1.0 / np.sqrt(fan_in)
        drawn: F32 = (self.rng.standard_normal((fan_in, fan_out)) * scale).astype(np.float32)
        return drawn

    def spread(self, shape: tuple[int, ...], scale: float, center: float = 0.0) -> F32:
        return (center + scale * self.rng.standard_normal(shape)).astype(np.float32)


def _compressor(draw: _Draw, cfg: Config, ratio: int, overlap: int, d: int) -> CompressorWeights:
    width = overlap * d
    return CompressorWeights(
        w_kv=draw.matrix(cfg.hidden, width),
        w_gate=draw.matrix(cfg.hidden, width),
        bias=draw.spread((ratio, width), BIAS_SCALE),
        norm=draw.spread((d,), GAIN_SCALE, 1.0),
    )


def _indexer(draw: _Draw, cfg: Config, spec: LayerSpec) -> IndexerWeights:
    return IndexerWeights(
        w_q=draw.matrix(cfg.q_rank, cfg.index_heads * cfg.index_dim),
        w_weights=draw.matrix(cfg.hidden, cfg.index_heads),
        compressor=_compressor(draw, cfg, spec.ratio, spec.overlap, cfg.index_dim),
    )


def _layer(draw: _Draw, cfg: Config, spec: LayerSpec) -> LayerWeights:
    qk_width = cfg.n_heads * cfg.head_dim
    has_compressor = spec.overlap > 0
    return LayerWeights(
        attn_norm=draw.spread((cfg.hidden,), GAIN_SCALE, 1.0),
        w_qa=draw.matrix(cfg.hidden, cfg.q_rank),
        q_norm=draw.spread((cfg.q_rank,), GAIN_SCALE, 1.0),
        w_qb=draw.matrix(cfg.q_rank, qk_width),
        w_kv=draw.matrix(cfg.hidden, cfg.head_dim),
        kv_norm=draw.spread((cfg.head_dim,), GAIN_SCALE, 1.0),
        sink=draw.spread((cfg.n_heads,), SINK_SCALE),
        w_o=draw.matrix(qk_width, cfg.hidden),
        ffn_norm=draw.spread((cfg.hidden,), GAIN_SCALE, 1.0),
        w_gate=draw.matrix(cfg.hidden, cfg.ffn_dim),
        w_up=draw.matrix(cfg.hidden, cfg.ffn_dim),
        w_down=draw.matrix(cfg.ffn_dim, cfg.hidden),
        compressor=(
            _compressor(draw, cfg, spec.ratio, spec.overlap, cfg.head_dim)
            if has_compressor
            else None
        ),
        indexer=_indexer(draw, cfg, spec) if spec.has_indexer else None,
    )


def init_weights(cfg: Config) -> Weights:
    """All weights of the model described by `cfg`, reproducible from `cfg.seed`."""
    draw = _Draw(cfg.seed)
    embed = draw.spread((cfg.vocab, cfg.hidden), 1.0)
    layers = tuple(_layer(draw, cfg, spec) for spec in cfg.layer_specs())
    weights = Weights(
        embed=embed,
        layers=layers,
        final_norm=draw.spread((cfg.hidden,), GAIN_SCALE, 1.0),
        lm_head=draw.matrix(cfg.hidden, cfg.vocab),
    )
    assert len(weights.layers) == cfg.n_layers
    assert weights.embed.dtype == np.float32 and weights.lm_head.dtype == np.float32
    return weights
