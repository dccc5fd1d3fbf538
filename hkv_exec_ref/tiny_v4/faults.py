"""Fault switches that deliberately break a resume state (docs/v4_cache.md section 6).

Section 6 says dropping any one piece of the resume state breaks bit-exactness; these
switches let negative tests prove the exactness oracle notices. Each fault is applied to
the state a forward pass is GIVEN, before it reads anything, keeping every shape (a
dropped piece reads back as a dummy page, the way a lost cache page would):

- DROP_OVERLAP_BLOCK: in the main r = 4 compressor tail, the rows of the previous
  complete block (needed for the overlap) are reset to the padding sentinel.
- DROP_TAIL: in every compressor tail (main and indexer), the rows of the open block
  (positions r*floor(P/r) .. P-1) are reset to the padding sentinel.
- DROP_WINDOW_ROW: in every layer, the oldest SWA window row is zeroed.
- DROP_INDEXER_KEYS: in every CSA layer, every indexer key KI_j is zeroed.

Enable them per call (`model.forward(..., faults=Fault.DROP_TAIL)`) or for a block of
code (`with inject(Fault.DROP_TAIL | Fault.DROP_WINDOW_ROW): ...`); both combine.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from contextvars import ContextVar

import attrs
import numpy as np

from hkv_exec_ref.tiny_v4.config import CSA_OVERLAP
from hkv_exec_ref.tiny_v4.state import LayerState, ModelState, TailRows, sentinel_rows


class Fault(enum.Flag):
    """Switches that break one piece of a resume state on purpose (see the module docstring); they combine."""

    NONE = 0
    DROP_OVERLAP_BLOCK = enum.auto()
    DROP_TAIL = enum.auto()
    DROP_WINDOW_ROW = enum.auto()
    DROP_INDEXER_KEYS = enum.auto()


_ACTIVE: ContextVar[Fault] = ContextVar("tiny_v4_faults", default=Fault.NONE)


@contextlib.contextmanager
def inject(faults: Fault) -> Iterator[None]:
    """Apply `faults` to every forward pass run inside the block (adds to outer ones)."""
    token = _ACTIVE.set(_ACTIVE.get() | faults)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_faults() -> Fault:
    return _ACTIVE.get()


def _sentinel_between(tail: TailRows, lo: int, hi: int) -> TailRows:
    """A copy of `tail` whose rows of positions [lo, hi) read as padding."""
    a, z = tail.a.copy(), tail.z.copy()
    pad_a, pad_z = sentinel_rows(hi - lo, a.shape[1])
    a[lo - tail.start : hi - tail.start], z[lo - tail.start : hi - tail.start] = pad_a, pad_z
    return TailRows(start=tail.start, a=a, z=z)


def _drop_overlap(layer: LayerState, p: int) -> LayerState:
    if layer.tail is None or layer.spec.overlap != CSA_OVERLAP:
        return layer
    r = layer.spec.ratio
    lo = r * (p // r) - r
    return attrs.evolve(layer, tail=_sentinel_between(layer.tail, lo, lo + r))


def _drop_tail(layer: LayerState, p: int) -> LayerState:
    if layer.tail is None:
        return layer
    lo = layer.spec.ratio * (p // layer.spec.ratio)
    index_tail = layer.index_tail
    if index_tail is not None:
        index_tail = _sentinel_between(index_tail, lo, p)
    return attrs.evolve(layer, tail=_sentinel_between(layer.tail, lo, p), index_tail=index_tail)


def _drop_window_row(layer: LayerState, p: int) -> LayerState:
    window = layer.window.copy()
    window[:1] = 0.0
    return attrs.evolve(layer, window=window)


def _drop_indexer_keys(layer: LayerState, p: int) -> LayerState:
    if layer.index_keys is None:
        return layer
    return attrs.evolve(layer, index_keys=np.zeros_like(layer.index_keys))


_BREAKERS = {
    Fault.DROP_OVERLAP_BLOCK: _drop_overlap,
    Fault.DROP_TAIL: _drop_tail,
    Fault.DROP_WINDOW_ROW: _drop_window_row,
    Fault.DROP_INDEXER_KEYS: _drop_indexer_keys,
}


def apply_faults(state: ModelState, faults: Fault) -> ModelState:
    """`state` with every piece named in `faults` broken (a new state; the input is kept)."""
    layers = state.layers
    for fault, breaker in _BREAKERS.items():
        if fault in faults:
            layers = tuple(breaker(layer, state.prefix_tokens) for layer in layers)
    assert len(layers) == len(state.layers)
    return ModelState(prefix_tokens=state.prefix_tokens, layers=layers)
