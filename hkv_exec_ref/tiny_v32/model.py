"""TinyV32: an exact tiny DeepSeek-V3.2-style model (MLA latents, a lightning indexer, top-k sparse attention).

Every layer keeps, per token, one latent (K = V, `kv_lora_rank + qk_rope_head_dim` values) and one indexer key
(`index_head_dim` values).  A query scores every earlier indexer key (ReLU-gated, weighted per-head dot
products, tiny V4's `index_scores`), keeps the top-min(k, visible) - ties to the lower position - and attends
over those latents only.  Each token is computed alone, in position order, with sequential float32 sums, so its
logits never depend on chunking or where it resumed: served from any saved state, they equal `recompute`
bit for bit.  A hit must carry both per-token kinds: a resume whose indexer keys were lost would select other
latents (docs/models.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from hkv_exec_ref.tiny_v4.indexer import index_scores
from hkv_exec_ref.tiny_v4.numerics import F32, proj
from hkv_exec_ref.token_model import TokenModel, Tokens, seeded_matrix, softmax_heads

__all__ = ["TinyV32", "Tokens", "V32Config", "V32State"]


@attrs.frozen(kw_only=True)
class V32Config:
    """Sizes read from a `deepseek_v32` config (specs/presets/tiny_v32.toml)."""

    n_layers: int
    hidden: int
    n_heads: int
    latent: int  # kv_lora_rank + qk_rope_head_dim
    index_heads: int
    index_dim: int
    topk: int
    vocab: int
    seed: int = 0

    @classmethod
    def from_hf_config(cls, hf: Mapping[str, Any], *, seed: int = 0) -> V32Config:
        return cls(n_layers=int(hf["num_hidden_layers"]), hidden=int(hf["hidden_size"]),
                   n_heads=int(hf["num_attention_heads"]),
                   latent=int(hf["kv_lora_rank"]) + int(hf["qk_rope_head_dim"]),
                   index_heads=int(hf["index_n_heads"]), index_dim=int(hf["index_head_dim"]),
                   topk=int(hf["index_topk"]), vocab=int(hf["vocab_size"]), seed=seed)


@attrs.define
class V32State:
    """The state at P: per layer the latents (P, latent) and indexer keys (P, index_dim) of [0, P)."""

    tokens: int
    latents: list[F32]
    keys: list[F32]

    @classmethod
    def empty(cls, cfg: V32Config) -> V32State:
        return cls(tokens=0, latents=[np.zeros((0, cfg.latent), np.float32) for _ in range(cfg.n_layers)],
                   keys=[np.zeros((0, cfg.index_dim), np.float32) for _ in range(cfg.n_layers)])

    def copy(self) -> V32State:
        return V32State(tokens=self.tokens, latents=[a.copy() for a in self.latents],
                        keys=[a.copy() for a in self.keys])


def _weights(cfg: V32Config) -> dict[str, F32]:
    rng = np.random.default_rng(cfg.seed)

    def w(*shape: int) -> F32:
        return seeded_matrix(rng, *shape)

    out = {"embed": w(cfg.vocab, cfg.hidden), "head": w(cfg.hidden, cfg.vocab)}
    for i in range(cfg.n_layers):
        out[f"{i}.norm"] = np.ones(cfg.hidden, np.float32)
        out[f"{i}.q"], out[f"{i}.kv"] = w(cfg.hidden, cfg.n_heads * cfg.latent), w(cfg.hidden, cfg.latent)
        out[f"{i}.out"] = w(cfg.n_heads * cfg.latent, cfg.hidden)
        out[f"{i}.iq"] = w(cfg.hidden, cfg.index_heads * cfg.index_dim)
        out[f"{i}.ik"], out[f"{i}.iw"] = w(cfg.hidden, cfg.index_dim), w(cfg.hidden, cfg.index_heads)
    return out


class TinyV32(TokenModel[V32State]):
    """A seeded tiny V3.2-style model with explicit state (see the module docstring)."""

    def __init__(self, config: V32Config) -> None:
        self.config, self.vocab, self.n_layers = config, config.vocab, config.n_layers
        self.w = _weights(config)

    def _empty(self) -> V32State:
        return V32State.empty(self.config)

    def _mix(self, layer: int, h: F32, st: V32State) -> F32:
        return self._attend(layer, h, st)

    def _attend(self, i: int, h: F32, st: V32State) -> F32:
        """Append this token's latent and indexer key; attend over the top-k latents its indexer selects."""
        cfg, w = self.config, self.w
        st.latents[i] = np.concatenate([st.latents[i], proj(h, w[f"{i}.kv"])])
        st.keys[i] = np.concatenate([st.keys[i], proj(h, w[f"{i}.ik"])])
        q_index = proj(h, w[f"{i}.iq"]).reshape(cfg.index_heads, cfg.index_dim)
        weights = proj(h, w[f"{i}.iw"])[0] * np.float32((cfg.index_dim * cfg.index_heads) ** -0.5)
        scores = index_scores(q_index, weights, st.keys[i])  # every position up to this one
        order = np.argsort(-(scores + np.float32(0.0)), kind="stable")[:cfg.topk]
        chosen = st.latents[i][np.sort(order)]  # ascending positions
        q = proj(h, w[f"{i}.q"]).reshape(cfg.n_heads, cfg.latent)
        return softmax_heads(chosen, chosen, q, np.float32(cfg.latent ** -0.5))  # K = V: the latent
