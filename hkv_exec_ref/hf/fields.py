"""Every field of an HF cache by name, so that two caches can be compared field by field (docs/hf.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["cache_fields"]

V4_TABLES = ("compressed_kv", "buffer_kv", "buffer_gate", "overlap_kv", "overlap_gate")


def _field(tensor: torch.Tensor | None) -> np.ndarray:
    """A cache tensor as an array; None (never set) and an empty tensor both as an empty array."""
    if tensor is None or tensor.numel() == 0:
        return np.zeros(0, np.float32)
    return tensor.detach().numpy().copy()


def cache_fields(cache: Any) -> dict[str, Any]:
    """`layer 1 buffer_kv[indexer]`, `layer 0 values`, ...: keys, values and sequence length of every layer, and
    DeepSeek-V4's compressor tables (entries, counts, open-block buffers, overlap rows) where a layer has them."""
    out: dict[str, Any] = {}
    for i, layer in enumerate(cache.layers):
        out[f"layer {i} seq_length"] = layer.get_seq_length()
        out[f"layer {i} keys"] = _field(layer.keys if layer.is_initialized else None)
        out[f"layer {i} values"] = _field(layer.values if layer.is_initialized else None)
        for name in getattr(layer, "compressed_kv", {}):
            out[f"layer {i} entry_count[{name}]"] = layer.entry_count[name]
            for table_name in V4_TABLES:
                table = getattr(layer, table_name, None)
                if table is not None:
                    out[f"layer {i} {table_name}[{name}]"] = _field(table.get(name))
    return out
