"""TinyHybrid: an exact tiny Qwen3-Next-style hybrid (full attention + gated linear recurrence layers).

`forward(tokens, state)` processes tokens at positions P .. P+n-1 given the state at P (`HybridState`) and
returns their logits and the state at P+n.  Every token is computed alone, in position order, with the
canonical float32 primitives of `tiny_v4.numerics` (sequential sums, one exp code path), so the logits of a
position never depend on how the sequence was chunked or where it resumed: logits served from any saved state
are bit-identical (`np.array_equal`) to `recompute` of the whole sequence.

A full-attention layer keeps K and V of every earlier position (one KV head, RoPE-free: the positions enter
through the causal order alone).  A linear layer keeps exactly what a resume needs and nothing per token
(docs/models.md, "Linear-attention and state-space hybrids"):

- its convolution state: the last kernel - 1 inputs of the short causal convolution over q, k and v
  (channels 2 * key_heads * key_dim + value_heads * value_dim, as Qwen3-Next's Gated DeltaNet);
- its recurrent state: per value head a key_dim x value_dim matrix S, updated per token by the gated delta
  rule  S <- g * S + k^T (v - (g * S)^T k) * beta, read out as o = S^T q.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from hkv_exec_ref.tiny_v4.numerics import F32, ONE, exp32, proj, seq_sum
from hkv_exec_ref.token_model import TokenModel, Tokens, seeded_matrix, softmax_heads

__all__ = ["HybridConfig", "HybridState", "TinyHybrid", "Tokens"]
EPS = 1e-6  # the key normalisation's epsilon


@attrs.frozen(kw_only=True)
class HybridConfig:
    """Sizes of the tiny hybrid, read from a `qwen3_next` style config (specs/presets/tiny_linear.toml)."""

    n_layers: int
    full_layers: tuple[int, ...]
    hidden: int
    head_dim: int
    n_heads: int
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    kernel: int
    vocab: int
    seed: int = 0

    @classmethod
    def from_hf_config(cls, hf: Mapping[str, Any], *, seed: int = 0) -> HybridConfig:
        """The config a `qwen3_next` dict describes (one KV head; full layers every full_attention_interval)."""
        layers = int(hf["num_hidden_layers"])
        every = int(hf.get("full_attention_interval", 4))
        assert int(hf.get("num_key_value_heads", 1)) == 1, "the tiny hybrid has one KV head"
        return cls(n_layers=layers, full_layers=tuple(i for i in range(layers) if (i + 1) % every == 0),
                   hidden=int(hf["hidden_size"]), head_dim=int(hf["head_dim"]),
                   n_heads=int(hf["num_attention_heads"]), key_heads=int(hf["linear_num_key_heads"]),
                   value_heads=int(hf["linear_num_value_heads"]), key_dim=int(hf["linear_key_head_dim"]),
                   value_dim=int(hf["linear_value_head_dim"]), kernel=int(hf["linear_conv_kernel_dim"]),
                   vocab=int(hf["vocab_size"]), seed=seed)

    @property
    def conv_channels(self) -> int:
        return 2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.n_layers) if i not in self.full_layers)


@attrs.define
class HybridState:
    """The state at P: K and V rows [0, P) of each full layer, conv and recurrent state of each linear layer."""

    tokens: int
    kv: dict[int, F32]  # full layer -> (P, 2, 1, head_dim)
    conv: dict[int, F32]  # linear layer -> (conv_channels, kernel - 1), oldest input first
    ssm: dict[int, F32]  # linear layer -> (value_heads, key_dim, value_dim)

    @classmethod
    def empty(cls, cfg: HybridConfig) -> HybridState:
        """The state at P = 0: no rows, zero convolution inputs, zero recurrent state."""
        return cls(tokens=0, kv={i: np.zeros((0, 2, 1, cfg.head_dim), np.float32) for i in cfg.full_layers},
                   conv={i: np.zeros((cfg.conv_channels, cfg.kernel - 1), np.float32) for i in cfg.linear_layers},
                   ssm={i: np.zeros((cfg.value_heads, cfg.key_dim, cfg.value_dim), np.float32)
                        for i in cfg.linear_layers})

    def copy(self) -> HybridState:
        return HybridState(tokens=self.tokens, kv={k: v.copy() for k, v in self.kv.items()},
                           conv={k: v.copy() for k, v in self.conv.items()},
                           ssm={k: v.copy() for k, v in self.ssm.items()})


def _weights(cfg: HybridConfig) -> dict[str, F32]:
    rng = np.random.default_rng(cfg.seed)

    def w(*shape: int) -> F32:
        return seeded_matrix(rng, *shape)

    out = {"embed": w(cfg.vocab, cfg.hidden), "head": w(cfg.hidden, cfg.vocab)}
    for i in range(cfg.n_layers):
        out[f"{i}.norm"] = np.ones(cfg.hidden, np.float32)
        out[f"{i}.out"] = w(cfg.n_heads * cfg.head_dim if i in cfg.full_layers else cfg.value_heads * cfg.value_dim,
                            cfg.hidden)
        if i in cfg.full_layers:
            out[f"{i}.q"], out[f"{i}.kv"] = w(cfg.hidden, cfg.n_heads * cfg.head_dim), w(cfg.hidden, 2 * cfg.head_dim)
        else:
            out[f"{i}.in"], out[f"{i}.gate"] = w(cfg.hidden, cfg.conv_channels), w(cfg.hidden, 2 * cfg.value_heads)
            out[f"{i}.conv"] = (rng.standard_normal((cfg.conv_channels, cfg.kernel)) / 2).astype(np.float32)
    return out


def _silu(x: F32) -> F32:
    out: F32 = x / (ONE + exp32(-x))
    return out


def _sigmoid(x: F32) -> F32:
    out: F32 = ONE / (ONE + exp32(-x))
    return out


class TinyHybrid(TokenModel[HybridState]):
    """A seeded tiny hybrid with explicit state (see the module docstring)."""

    def __init__(self, config: HybridConfig) -> None:
        self.config, self.vocab, self.n_layers = config, config.vocab, config.n_layers
        self.w = _weights(config)

    def _empty(self) -> HybridState:
        return HybridState.empty(self.config)

    def _mix(self, layer: int, h: F32, st: HybridState) -> F32:
        return self._attend(layer, h, st) if layer in self.config.full_layers else self._recur(layer, h, st)

    def _attend(self, i: int, h: F32, st: HybridState) -> F32:
        """Causal full attention of one query over K, V rows [0, t] (the new row appended to the state)."""
        cfg = self.config
        q = proj(h, self.w[f"{i}.q"]).reshape(cfg.n_heads, cfg.head_dim)
        kv = proj(h, self.w[f"{i}.kv"]).reshape(1, 2, 1, cfg.head_dim)
        rows = np.concatenate([st.kv[i], kv])
        st.kv[i] = rows
        keys, values = rows[:, 0, 0, :], rows[:, 1, 0, :]  # (t + 1, head_dim)
        return softmax_heads(keys, values, q, np.float32(1.0 / np.sqrt(cfg.head_dim)))

    def _recur(self, i: int, h: F32, st: HybridState) -> F32:
        """One token through the short convolution and the gated delta rule, updating the layer's state."""
        cfg = self.config
        x = proj(h, self.w[f"{i}.in"])[0]  # (channels,)
        window = np.concatenate([st.conv[i], x[:, None]], axis=1)  # (channels, kernel): oldest first
        st.conv[i] = window[:, 1:]
        y = _silu(seq_sum(window * self.w[f"{i}.conv"], axis=1))
        kd = cfg.key_heads * cfg.key_dim
        q = y[:kd].reshape(cfg.key_heads, cfg.key_dim)
        k = y[kd:2 * kd].reshape(cfg.key_heads, cfg.key_dim)
        v = y[2 * kd:].reshape(cfg.value_heads, cfg.value_dim)
        gates = _sigmoid(proj(h, self.w[f"{i}.gate"])[0])
        decay, beta = gates[:cfg.value_heads], gates[cfg.value_heads:]
        per = cfg.value_heads // cfg.key_heads
        outs, ssm = [], st.ssm[i].copy()
        for head in range(cfg.value_heads):
            kh = k[head // per] / np.sqrt(seq_sum(k[head // per] * k[head // per], axis=0) + np.float32(EPS))
            s = ssm[head] * decay[head]  # (key_dim, value_dim)
            predicted = seq_sum(s * kh[:, None], axis=0)  # (value_dim,)
            s = s + kh[:, None] * ((v[head] - predicted) * beta[head])[None, :]
            ssm[head] = s
            outs.append(seq_sum(s * q[head // per][:, None], axis=0))
        st.ssm[i] = ssm
        out: F32 = np.concatenate(outs)[None, :]
        return out
