"""Tiny random-initialized Hugging Face models, and the adapter that lets hkv's Engine serve them.

`HfModel` has the part of TinyV4's interface the Engine uses (`config`, `xp`, `empty_state`, `forward`): a
forward pass rebuilds HF's own cache from the resume state the engine read from the pools, runs HF's forward on
the tokens, and returns the logits and the resume state HF's cache then holds - so every call starts from what
hkv stored, never from a cache HF kept (docs/hf.md).  It records every call (start, end).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hkv_exec_ref.hf import v4_cache
from hkv_exec_ref.tiny_v4 import Config, Fault, ModelState
from hkv_exec_ref.tiny_v4.faults import apply_faults

__all__ = ["MODELS", "HfModel", "tiny_config", "tiny_hf_model"]

V4_LAYER_TYPES = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]
V4_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}


def _v4_config(index_topk: int) -> Any:
    from transformers import DeepseekV4Config

    return DeepseekV4Config(
        vocab_size=64, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, q_lora_rank=16, num_experts_per_tok=1,
        n_routed_experts=2, n_shared_experts=1, layer_types=V4_LAYER_TYPES, compress_rates=V4_RATES,
        sliding_window=8, o_groups=1, o_lora_rank=16, index_n_heads=2, index_head_dim=8, index_topk=index_topk,
        num_nextn_predict_layers=0, hc_mult=2, max_position_embeddings=4096, dtype="float32",
        **V4_EXTRA)


HKV_OPTIONS = {"block_tokens": 8, "alignment_bytes": 64}  # the config's hkv table: block = lcm(4, 8), small pages
# keys transformers' DeepseekV4Config keeps without declaring them: the rope head size, hkv's own table
V4_EXTRA: dict[str, Any] = {"qk_rope_head_dim": 8, "hkv": HKV_OPTIONS}
MODELS = ("deepseek_v4", "llama")  # what HfEngine.tiny(model=...) builds


def tiny_hf_model(model: str, seed: int, *, index_topk: int = 4) -> Any:
    """A random-initialized tiny transformers model (float32, eval mode), reproducible from `seed`."""
    from transformers import DeepseekV4ForCausalLM

    from hkv_exec_ref.hf.llama import tiny_llama

    assert model in MODELS, model
    if model == "llama":
        return tiny_llama(seed, HKV_OPTIONS)
    torch.manual_seed(seed)
    built: Any = DeepseekV4ForCausalLM(_v4_config(index_topk))
    return built.eval()


def tiny_config(hf_config: Any, seed: int) -> Config:
    """TinyV4's Config for the sizes hkv's state routing reads (ratios, window, widths) of an HF V4 config."""
    rates = dict(hf_config.compress_rates)
    ratios = tuple(0 if t == "sliding_attention" else int(rates[t]) for t in hf_config.layer_types)
    return Config(compress_ratios=ratios, window_tokens=hf_config.sliding_window, hidden=hf_config.hidden_size,
                  n_heads=hf_config.num_attention_heads, head_dim=hf_config.head_dim,
                  rope_dims=hf_config.qk_rope_head_dim, index_heads=hf_config.index_n_heads,
                  index_dim=hf_config.index_head_dim, index_topk=hf_config.index_topk, vocab=hf_config.vocab_size,
                  seed=seed)


class HfModel:
    """An HF causal LM behind the interface hkv's Engine drives (state in, logits and state out)."""

    xp: Any = np

    def __init__(self, hf_model: Any, seed: int) -> None:
        self.hf = hf_model
        self.config = tiny_config(hf_model.config, seed)
        self.calls: list[tuple[int, int]] = []

    def empty_state(self) -> ModelState:
        return ModelState.empty(self.config)

    def cache(self, state: ModelState) -> Any:
        """HF's cache holding `state`."""
        return v4_cache.cache_from_state(state, self.config, self.hf.config)

    def forward(self, tokens: Any, state: ModelState, *, faults: Fault = Fault.NONE,
                probe: Any = None) -> tuple[np.ndarray, ModelState]:
        """Logits of `tokens` at P .. P+n-1 from HF's forward over a cache rebuilt from `state`; the state at P+n."""
        p = state.prefix_tokens
        cache = self.cache(apply_faults(state, faults))
        ids = torch.as_tensor(np.asarray(tokens, np.int64))[None]
        with torch.no_grad():
            logits = self.hf(input_ids=ids, past_key_values=cache, use_cache=True).logits[0]
        end = p + ids.shape[1]
        self.calls.append((p, end))
        return logits.numpy().astype(np.float32), v4_cache.state_from_cache(cache, self.config, end)
