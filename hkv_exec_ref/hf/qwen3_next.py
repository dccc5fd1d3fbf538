"""transformers' Qwen3-Next served through hkv: the model behind `HybridServer`, its state from hkv's pools.

`HfQwen3Next` has the interface `HybridServer` drives (`config`, `forward(tokens, state)`): each call rebuilds
HF's own cache (`DynamicCache`: K / V of the full-attention layers, the convolution and recurrent states of the
Gated DeltaNet layers) from the `HybridState` read from the pools, runs HF's forward over the tokens, and
returns the logits and the state HF's cache then holds.  HF keeps a convolution window of `kernel` columns
where hkv keeps the last `kernel - 1` inputs: the oldest column only feeds an output HF drops, so it is
rebuilt as zeros.  HF's outputs depend on how tokens are split into calls (its chunked delta rule rounds
differently for other lengths), so the oracle is HF's own run over the same call boundaries (`chunked`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hkv_exec_ref.tiny_linear.model import HybridConfig, HybridState, Tokens
from hkv_exec_ref.tiny_v4.numerics import F32

__all__ = ["HfQwen3Next", "tiny_qwen3_next"]

HKV_OPTIONS = {"block_tokens": 8, "alignment_bytes": 64}
LINEAR, FULL = "linear_attention", "full_attention"


def tiny_qwen3_next(seed: int = 0) -> Any:
    """A random-initialized tiny transformers Qwen3-Next (float32, eval mode; layers linear, full, linear, full)."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    config = Qwen3NextConfig(  # type: ignore[call-arg]  # full_attention_interval: a kwarg the class reads
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, full_attention_interval=2,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
        max_position_embeddings=4096, dtype="float32")
    config.hkv = HKV_OPTIONS  # kept by to_dict(): the layout's block and alignment
    torch.manual_seed(seed)
    built: Any = Qwen3NextForCausalLM(config)
    return built.eval()


class HfQwen3Next:
    """A transformers Qwen3-Next model behind HybridServer's `forward(tokens, state)` (one KV head)."""

    def __init__(self, model: Any) -> None:
        self.model, self.hf = model, model.config
        types = list(self.hf.layer_types)
        assert self.hf.num_key_value_heads == 1, "HybridState holds one KV head"
        self.config = HybridConfig(
            n_layers=len(types), full_layers=tuple(i for i, t in enumerate(types) if t == FULL),
            hidden=self.hf.hidden_size, head_dim=self.hf.head_dim, n_heads=self.hf.num_attention_heads,
            key_heads=self.hf.linear_num_key_heads, value_heads=self.hf.linear_num_value_heads,
            key_dim=self.hf.linear_key_head_dim, value_dim=self.hf.linear_value_head_dim,
            kernel=self.hf.linear_conv_kernel_dim, vocab=self.hf.vocab_size)
        self.calls: list[tuple[int, int]] = []  # (start, end) of every forward call

    def forward(self, tokens: Tokens, state: HybridState) -> tuple[F32, HybridState]:
        """HF's forward over `tokens` at positions state.tokens ..., from a cache rebuilt from `state`."""
        ids = torch.as_tensor(np.asarray(tokens, np.int64))[None]
        p, n = state.tokens, ids.shape[1]
        self.calls.append((p, p + n))
        cache = self._cache(state)
        with torch.no_grad():
            out = self.model(input_ids=ids, past_key_values=cache, use_cache=True,
                             cache_position=torch.arange(p, p + n))
        return out.logits[0].numpy().astype(np.float32), self._state(out.past_key_values, p + n)

    def chunked(self, tokens: Tokens, boundaries: Sequence[int]) -> F32:
        """HF's own run over `tokens`, one call per span between consecutive `boundaries`, HF keeping its cache:
        the logits of every position (the oracle)."""
        from transformers import DynamicCache

        ids = torch.as_tensor(np.asarray(tokens, np.int64))[None]
        cuts = sorted({0, *boundaries, ids.shape[1]})
        cache, out = DynamicCache(config=self.hf), []
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            with torch.no_grad():
                step = self.model(input_ids=ids[:, lo:hi], past_key_values=cache, use_cache=True,
                                  cache_position=torch.arange(lo, hi))
            cache = step.past_key_values
            out.append(step.logits[0].numpy().astype(np.float32))
        return np.concatenate(out)

    def _cache(self, state: HybridState) -> Any:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.hf)
        if not state.tokens:
            return cache
        for i in range(self.config.n_layers):
            if i in self.config.full_layers:
                rows = torch.as_tensor(state.kv[i])  # (P, 2, 1, head_dim)
                cache.update(rows[:, 0].permute(1, 0, 2)[None].contiguous(),
                             rows[:, 1].permute(1, 0, 2)[None].contiguous(), i)
                continue
            conv = torch.zeros((1, self.config.conv_channels, self.config.kernel), dtype=torch.float32)
            conv[0, :, 1:] = torch.as_tensor(state.conv[i])
            ssm = torch.as_tensor(state.ssm[i])[None].contiguous()
            layer: Any = cache.layers[i]
            layer.lazy_initialization(conv_states=conv, recurrent_states=ssm)
            layer.conv_states[0].copy_(conv)
            layer.recurrent_states[0].copy_(ssm)
            layer.has_previous_state[0] = True
        return cache

    def _state(self, cache: Any, end: int) -> HybridState:
        state = HybridState.empty(self.config)
        state.tokens = end
        for i in range(self.config.n_layers):
            layer: Any = cache.layers[i]
            if i in self.config.full_layers:
                keys, values = layer.keys[0].permute(1, 0, 2), layer.values[0].permute(1, 0, 2)  # (P, 1, hd)
                state.kv[i] = torch.stack([keys, values], dim=1).numpy().astype(np.float32)
            else:
                state.conv[i] = layer.conv_states[0][0, :, 1:].numpy().astype(np.float32).copy()
                state.ssm[i] = layer.recurrent_states[0][0].numpy().astype(np.float32).copy()
        return state
