"""Full invariant checks of a resume state against docs/v4_cache.md section 6.

Functions returning the list of problems found (empty = valid), not asserts, so tests,
simulators and a debug flag can all call them (docs/design.md section 8).
"""

from __future__ import annotations

import numpy as np

from hkv_exec_ref.tiny_v4.config import Config, LayerSpec
from hkv_exec_ref.tiny_v4.state import (
    LayerState,
    ModelState,
    TailRows,
    expected_sizes,
    sentinel_rows,
    tail_start,
    window_start,
)


def _tail_problems(name: str, tail: TailRows, p: int, spec: LayerSpec, width: int) -> list[str]:
    out = []
    t0 = tail_start(p, spec.ratio, spec.overlap)
    if (tail.start, tail.stop) != (t0, p):
        out.append(f"{name}: rows [{tail.start}, {tail.stop}) != [{t0}, {p})")
    if tail.a.shape != tail.z.shape or tail.a.shape[1:] != (width,):
        out.append(f"{name}: shapes {tail.a.shape} / {tail.z.shape}, width {width}")
    n_pad = max(0, -tail.start)
    pad_a, pad_z = sentinel_rows(n_pad, width)
    if not (np.array_equal(tail.a[:n_pad], pad_a) and np.array_equal(tail.z[:n_pad], pad_z)):
        out.append(f"{name}: rows before position 0 are not the sentinel (a=0, z=-inf)")
    if not np.all(np.isfinite(tail.z[n_pad:])):
        out.append(f"{name}: a real row holds a non-finite gate")
    return out


def layer_problems(layer: LayerState, p: int, cfg: Config) -> list[str]:
    """Every way `layer` differs from the minimal state at P of section 6 (empty = none)."""
    spec = layer.spec
    out = []
    if layer.window_start != window_start(p, cfg.window_tokens):
        out.append(f"window_start {layer.window_start} != {window_start(p, cfg.window_tokens)}")
    arrays = [layer.window, layer.entries, layer.index_keys]
    arrays += [t.a for t in (layer.tail, layer.index_tail) if t is not None]
    if any(x is not None and x.dtype != np.float32 for x in arrays):
        out.append("an array is not float32")
    if layer.tail is not None:
        out += _tail_problems("tail", layer.tail, p, spec, spec.overlap * cfg.head_dim)
    if layer.index_tail is not None:
        out += _tail_problems("index_tail", layer.index_tail, p, spec, spec.overlap * cfg.index_dim)
    return out


def state_problems(state: ModelState, cfg: Config) -> list[str]:
    """Full invariant check of a resume state against section 6 (empty list = valid).

    A function, not asserts, so tests, simulators and a debug flag can all call it.
    """
    p = state.prefix_tokens
    if len(state.layers) != cfg.n_layers:
        return [f"{len(state.layers)} layers, config has {cfg.n_layers}"]
    out = [f"sizes at P={p}: {state.sizes()} != {expected_sizes(cfg, p)}"]
    out = out if state.sizes() != expected_sizes(cfg, p) else []
    for i, (layer, spec) in enumerate(zip(state.layers, cfg.layer_specs(), strict=True)):
        out += [f"layer {i}: kind {layer.spec.kind} != {spec.kind}"] if layer.spec != spec else []
        out += [f"layer {i}: {problem}" for problem in layer_problems(layer, p, cfg)]
    return out
