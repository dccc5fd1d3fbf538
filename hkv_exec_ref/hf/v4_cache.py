"""Hugging Face DeepSeek-V4 cache <-> hkv resume state (docs/hf.md).

transformers keeps, per layer (`DeepseekV4HCACache` / `DeepseekV4CSACache`, and a plain sliding-window layer for
`sliding_attention`): the last W-1 latent rows (`keys`, the same tensor as `values`), and per compressor
(`"compressor"`, plus `"indexer"` on CSA layers) the compressed entries, their count, the rows of the open
block (`buffer_kv` / `buffer_gate`, P mod r rows, gate without the position bias) and on CSA the Ca half of the
last full block (`overlap_kv` / `overlap_gate`, r rows, gate with the bias added).

hkv's resume state at P holds the same objects (docs/v4_cache.md): window rows [P-W+1, P), compressed entries
and indexer keys [0, P/r), and a compressor tail of rows [tail_start(P), P) per compressor - on CSA (overlap 2)
the last full block and the open one.  The tail rows carry HF's own values: an overlap row is
(kv_Ca | 0, gate_Ca | -inf), an open row (kv, gate).  Rows before position 0 are the padding sentinel
(a = 0, z = -inf): HF has no overlap yet there.  Every copy is exact (float32 both ways).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hkv_exec_ref.tiny_v4 import Config, LayerState, ModelState, TailRows
from hkv_exec_ref.tiny_v4.state import sentinel_rows, tail_start, window_start

__all__ = ["cache_from_state", "state_from_cache"]

MAIN, INDEXER = "compressor", "indexer"


def _tensor(rows: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(rows, np.float32))


def _rows(tensor: torch.Tensor | None, width: int) -> np.ndarray:
    """(n, width) float32 rows of a (1, n, width) HF tensor (None: no rows)."""
    if tensor is None:
        return np.zeros((0, width), np.float32)
    return tensor[0].detach().numpy().astype(np.float32, copy=True)


# ------------------------------------------------------------------ hkv state -> HF cache


def _restore_window(layer: Any, state: LayerState, p: int) -> None:
    layer.cumulative_length = p
    if state.window.shape[0] == 0:
        return
    rows = _tensor(state.window)[None, None]  # (1, 1, n, D)
    layer.lazy_initialization(rows, rows)
    layer.keys = rows
    layer.values = rows


def _restore_compressor(layer: Any, name: str, entries: np.ndarray, tail: TailRows, p: int, ratio: int,
                        overlap: int) -> None:
    open_from = ratio * (p // ratio)
    buffer = tail.between(open_from, p)
    layer.compressed_kv[name] = _tensor(entries)[None]
    layer.entry_count[name] = p // ratio
    layer.buffer_kv[name] = _tensor(buffer.a)[None]
    layer.buffer_gate[name] = _tensor(buffer.z)[None]
    if overlap > 1:
        half = tail.a.shape[1] // 2
        if open_from - ratio < 0:  # no full block yet: HF holds no overlap
            layer.overlap_kv[name] = layer.overlap_gate[name] = None
        else:
            full = tail.between(open_from - ratio, open_from)
            layer.overlap_kv[name] = _tensor(full.a[:, :half])[None]
            layer.overlap_gate[name] = _tensor(full.z[:, :half])[None]


def cache_from_state(state: ModelState, cfg: Config, hf_config: Any) -> Any:
    """A `DynamicCache` holding exactly `state` (the resume state at P), ready for HF's forward at P."""
    from transformers import DynamicCache

    cache = DynamicCache(config=hf_config)
    p = state.prefix_tokens
    for layer, layer_state, spec in zip(cache.layers, state.layers, cfg.layer_specs(), strict=True):
        _restore_window(layer, layer_state, p)
        if layer_state.tail is not None:
            _restore_compressor(layer, MAIN, layer_state.entries, layer_state.tail, p, spec.ratio, spec.overlap)
        if layer_state.index_tail is not None and layer_state.index_keys is not None:
            _restore_compressor(layer, INDEXER, layer_state.index_keys, layer_state.index_tail, p, spec.ratio,
                                spec.overlap)
    return cache


# ------------------------------------------------------------------ HF cache -> hkv state


def _tail(layer: Any, name: str, p: int, ratio: int, overlap: int, width: int) -> TailRows:
    """The tail rows [tail_start(P), P) in HF's values (sentinel rows before position 0)."""
    start = tail_start(p, ratio, overlap)
    parts_a, parts_z = [], []
    if overlap > 1:
        if p < ratio:
            a, z = sentinel_rows(ratio, width)
        else:
            half = width // 2
            a = np.concatenate([_rows(layer.overlap_kv[name], half), np.zeros((ratio, half), np.float32)], 1)
            z = np.concatenate([_rows(layer.overlap_gate[name], half),
                                np.full((ratio, half), -np.inf, np.float32)], 1)
        parts_a.append(a)
        parts_z.append(z)
    parts_a.append(_rows(layer.buffer_kv.get(name), width))
    parts_z.append(_rows(layer.buffer_gate.get(name), width))
    tail = TailRows(start=start, a=np.concatenate(parts_a), z=np.concatenate(parts_z))
    assert tail.stop == p, (name, tail.start, tail.stop, p)
    return tail


def state_from_cache(cache: Any, cfg: Config, p: int) -> ModelState:
    """The minimal resume state at P that HF's cache holds after its calls over [0, P)."""
    layers = []
    for layer, spec in zip(cache.layers, cfg.layer_specs(), strict=True):
        window = _rows(layer.keys[:, 0] if layer.is_initialized else None, cfg.head_dim)
        w0 = window_start(p, cfg.window_tokens)
        window = window[window.shape[0] - (p - w0):] if p > w0 else window[:0]
        fields: dict[str, Any] = {"tail": None, "index_keys": None, "index_tail": None,
                                  "entries": np.zeros((0, cfg.head_dim), np.float32)}
        if spec.ratio:
            width = spec.overlap * cfg.head_dim
            fields["entries"] = _rows(layer.compressed_kv[MAIN], cfg.head_dim)
            fields["tail"] = _tail(layer, MAIN, p, spec.ratio, spec.overlap, width)
        if spec.has_indexer:
            fields["index_keys"] = _rows(layer.compressed_kv[INDEXER], cfg.index_dim)
            fields["index_tail"] = _tail(layer, INDEXER, p, spec.ratio, spec.overlap, spec.overlap * cfg.index_dim)
        layers.append(LayerState(spec=spec, window_start=w0, window=window, **fields))
    return ModelState(prefix_tokens=p, layers=tuple(layers))
