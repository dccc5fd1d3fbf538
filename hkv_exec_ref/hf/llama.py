"""Hugging Face Llama (GQA, `DynamicCache` keys and values) through the same bridge (docs/hf.md).

A full-attention layer's resume state at P is its K and V of positions [0, P): one `compressed_kv` entry of
shape (2, kv_heads, head_dim) per token (ratio 1) in hkv's layout.  `KvState` holds them per layer;
`read_state` / `write_state` move them between the pools (through the allocation's block tables and slots) and
`LlamaModel.forward` between a `DynamicCache` and HF's forward.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import torch

from hkv_core.executor import Executor
from hkv_core.layout import Layout
from hkv_core.manager import Allocation
from hkv_exec_ref.tiny_v4 import Config, Fault

__all__ = ["KvState", "LlamaModel", "read_state", "tiny_llama", "write_state"]

K_PART, V_PART = 0, 1


def tiny_llama(seed: int, hkv: dict[str, int]) -> Any:
    """A random-initialized tiny LlamaForCausalLM (GQA: 4 query heads, 2 KV heads of 8; float32, eval)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    options: dict[str, Any] = {"hkv": hkv}  # hkv's own table, kept in the config (transformers keeps extra keys)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         dtype="float32", **options)
    model: Any = LlamaForCausalLM(config)
    return model.eval()


@attrs.frozen(kw_only=True)
class KvState:
    """K and V of positions [0, P) per layer: arrays (P, kv_heads, head_dim)."""

    prefix_tokens: int
    keys: tuple[np.ndarray, ...]
    values: tuple[np.ndarray, ...]


class LlamaModel:
    """An HF Llama behind the Engine's model interface; the state is a KvState."""

    xp: Any = np

    def __init__(self, hf_model: Any, seed: int, window_tokens: int) -> None:
        self.hf = hf_model
        c = hf_model.config
        # the Engine reads vocab, max_positions, seed and the call size (window_tokens - 1) from a Config
        self.config = Config(compress_ratios=(0,) * c.num_hidden_layers, window_tokens=window_tokens,
                             vocab=c.vocab_size, seed=seed)
        self.heads = c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.calls: list[tuple[int, int]] = []

    def empty_state(self) -> KvState:
        empty = tuple(np.zeros((0, self.heads, self.head_dim), np.float32) for _ in range(self.config.n_layers))
        return KvState(prefix_tokens=0, keys=empty, values=empty)

    def cache(self, state: KvState) -> Any:
        """A DynamicCache holding `state`."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.hf.config)
        if state.prefix_tokens:
            layers: list[Any] = list(cache.layers)  # attention layers here: each holds keys and values
            for layer, k, v in zip(layers, state.keys, state.values, strict=True):
                keys = torch.from_numpy(np.ascontiguousarray(k.transpose(1, 0, 2)))[None]
                values = torch.from_numpy(np.ascontiguousarray(v.transpose(1, 0, 2)))[None]
                layer.lazy_initialization(keys, values)
                layer.keys, layer.values = keys, values
        return cache

    def forward(self, tokens: Any, state: KvState, *, faults: Fault = Fault.NONE,
                probe: Any = None) -> tuple[np.ndarray, KvState]:
        assert faults == Fault.NONE, "the fault switches are TinyV4's"
        p, cache = state.prefix_tokens, self.cache(state)
        ids = torch.as_tensor(np.asarray(tokens, np.int64))[None]
        with torch.no_grad():
            logits = self.hf(input_ids=ids, past_key_values=cache, use_cache=True).logits[0]
        end = p + ids.shape[1]
        self.calls.append((p, end))
        keys = tuple(layer.keys[0].numpy().transpose(1, 0, 2).copy() for layer in cache.layers)
        values = tuple(layer.values[0].numpy().transpose(1, 0, 2).copy() for layer in cache.layers)
        return logits.numpy().astype(np.float32), KvState(prefix_tokens=end, keys=keys, values=values)


def _pool(layout: Layout) -> str:
    (spec,) = layout.pools
    return spec.name


def read_state(executor: Executor, layout: Layout, alloc: Allocation, p: int) -> KvState:
    """K / V of positions [0, P) from the pool, through the allocation's block table."""
    pool = _pool(layout)
    per_page = layout.pools[0].entries_per_page
    index = np.arange(p, dtype=np.int64)
    slots = alloc.block_tables[pool].astype(np.int64)[index // per_page] * per_page + index % per_page
    layers = [executor.entries(pool, slots, layer) for layer in range(layout.pools[0].layer_count)]
    return KvState(prefix_tokens=p, keys=tuple(e[:, K_PART] for e in layers),
                   values=tuple(e[:, V_PART] for e in layers))


def write_state(executor: Executor, layout: Layout, alloc: Allocation, before: int, state: KvState) -> None:
    """The K / V rows of positions [before, P') into the allocation's slots."""
    pool, after = _pool(layout), state.prefix_tokens
    slots = alloc.slots[pool][before - alloc.start_tokens:after - alloc.start_tokens]
    rows = np.stack([np.stack([k[before:after], v[before:after]], axis=1)
                     for k, v in zip(state.keys, state.values, strict=True)], axis=1)
    executor.write(pool, slots, rows)
