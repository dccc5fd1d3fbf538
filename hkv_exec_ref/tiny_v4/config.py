"""Configuration of the tiny DeepSeek-V4-style model (docs/v4_cache.md sections 1 and 7).

`Config` holds every size of the model; `LayerSpec` is the per-layer kind (SWA, CSA or
HCA), looked up from the compress ratio so that code branches on data, not on `if` chains.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

SWA_RATIO = 0  # r = 0: sliding window only (section 1)
CSA_RATIO = 4  # r = 4: overlapping compressor (c = 2) + lightning indexer (sections 2, 3)
CSA_OVERLAP = 2  # c for r = 4; every other ratio pools without overlap (c = 1)

# Hugging Face style config keys (section 1) -> Config fields; absent keys keep defaults.
HF_KEYS = {
    "compress_ratios": "compress_ratios",
    "sliding_window": "window_tokens",
    "hidden_size": "hidden",
    "num_attention_heads": "n_heads",
    "head_dim": "head_dim",
    "qk_rope_head_dim": "rope_dims",
    "index_n_heads": "index_heads",
    "index_head_dim": "index_dim",
    "index_topk": "index_topk",
    "vocab_size": "vocab",
}


@attrs.frozen(kw_only=True)
class LayerSpec:
    """What one layer of ratio `ratio` keeps and computes (docs/v4_cache.md sections 1, 2, 6)."""

    ratio: int  # compress ratio r (0 = SWA)
    overlap: int  # c: how many consecutive blocks one pool window spans (0 for SWA)
    has_indexer: bool  # CSA only: lightning indexer with its own compressor
    rope_base: float

    @property
    def kind(self) -> str:
        """'swa', 'csa' or 'hca' (section 1)."""
        return "swa" if self.ratio == SWA_RATIO else ("csa" if self.has_indexer else "hca")


@attrs.frozen(kw_only=True)
class Config:
    """Sizes of tiny V4 (section 7's suggested tiny configuration by default)."""

    compress_ratios: tuple[int, ...] = (0, 4, 8)
    window_tokens: int = 8  # W: raw window, query t sees u in [t - W + 1, t]
    hidden: int = 32
    n_heads: int = 2
    head_dim: int = 16  # width of the one latent used as K and V, and of K_j
    rope_dims: int = 8  # rope on the LAST rope_dims dims of q / kv / K_j
    q_rank: int = 16  # width of qr_t, the query latent shared with the indexer
    index_heads: int = 2
    index_dim: int = 8  # width of KI_j (the indexer compressor's d)
    index_rope_dims: int = 4  # rope on the last index_rope_dims dims of qI / KI_j
    index_topk: int = 2
    ffn_dim: int = 64  # per-token gated FFN standing in for the MoE
    vocab: int = 64
    rope_base_swa: float = 10000.0
    rope_base_compressed: float = 160000.0
    max_positions: int = 4096  # rope tables are precomputed for positions [0, max_positions)
    norm_eps: float = 1e-6
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        assert len(self.compress_ratios) >= 1, "at least one layer"
        assert all(r >= 0 for r in self.compress_ratios), self.compress_ratios
        assert self.window_tokens >= 1, self.window_tokens
        assert 0 < self.rope_dims <= self.head_dim and self.rope_dims % 2 == 0
        assert 0 < self.index_rope_dims <= self.index_dim and self.index_rope_dims % 2 == 0
        assert self.index_topk >= 1 and self.index_heads >= 1
        assert self.max_positions >= 1

    @classmethod
    def from_hf_config(cls, hf: Mapping[str, Any], *, seed: int = 0) -> Config:
        """A Config from a Hugging Face style dict (e.g. specs/presets/tiny_v4.toml)."""
        fields: dict[str, Any] = {ours: hf[key] for key, ours in HF_KEYS.items() if key in hf}
        if "compress_ratios" in fields:
            fields["compress_ratios"] = tuple(int(r) for r in fields["compress_ratios"])
        cfg = cls(seed=seed, **fields)
        layers = hf.get("num_hidden_layers", cfg.n_layers)
        assert layers == cfg.n_layers, f"num_hidden_layers={layers} vs {cfg.compress_ratios}"
        return cfg

    @property
    def n_layers(self) -> int:
        return len(self.compress_ratios)

    def layer_spec(self, layer: int) -> LayerSpec:
        """The kind of layer `layer`, chosen by its ratio (section 1)."""
        ratio = self.compress_ratios[layer]
        is_csa = ratio == CSA_RATIO
        overlap = 0 if ratio == SWA_RATIO else (CSA_OVERLAP if is_csa else 1)
        base = self.rope_base_swa if ratio == SWA_RATIO else self.rope_base_compressed
        return LayerSpec(ratio=ratio, overlap=overlap, has_indexer=is_csa, rope_base=base)

    def layer_specs(self) -> tuple[LayerSpec, ...]:
        return tuple(self.layer_spec(i) for i in range(self.n_layers))
