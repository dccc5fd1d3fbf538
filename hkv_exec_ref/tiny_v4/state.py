"""The explicit resume state of tiny V4 (docs/v4_cache.md section 6).

At prefix length P each layer keeps exactly the objects section 6 lists, each in its own
array, so a cache manager can page them independently:

| field        | object kind (library name)     | rows at P                      |
| ------------ | ------------------------------ | ------------------------------ |
| window       | SWA window                     | positions [max(0, P-W+1), P)   |
| entries      | compressed KV (K_j)            | j < floor(P / r)               |
| tail         | uncompressed tail (a_t, z_t)   | [r*floor(P/r) - (c-1)*r, P)    |
| index_keys   | indexer state (KI_j)           | j < floor(P / 4)               |
| index_tail   | indexer state (its tail rows)  | same positions as `tail`       |

Tail rows at negative positions (r = 4 before block 0 completes) hold the padding
sentinel a = 0, z = -inf (section 2), so the r = 4 tail always has 4 + P mod 4 rows.
Forward passes never write into a state; they return a new one.
"""

from __future__ import annotations

import attrs
import numpy as np

from hkv_exec_ref.tiny_v4.config import Config, LayerSpec
from hkv_exec_ref.tiny_v4.numerics import F32

SizeTable = dict[str, int]


def window_start(prefix_tokens: int, window_tokens: int) -> int:
    """First position of the SWA window a resume at P needs (section 6)."""
    return max(0, prefix_tokens - window_tokens + 1)


def tail_start(prefix_tokens: int, ratio: int, overlap: int) -> int:
    """First position of the compressor tail at P: the open block, plus c-1 closed ones."""
    assert ratio > 0 and overlap >= 1, (ratio, overlap)
    return ratio * (prefix_tokens // ratio) - (overlap - 1) * ratio


def sentinel_rows(n: int, width: int) -> tuple[F32, F32]:
    """n padding rows: a = 0, z = -inf (their softmax weight is exactly 0)."""
    a = np.zeros((n, width), dtype=np.float32)
    z = np.full((n, width), -np.inf, dtype=np.float32)
    return a, z


@attrs.frozen(kw_only=True)
class TailRows:
    """Raw compressor rows (a_t, z_t) of positions [start, start + len) (section 2)."""

    start: int
    a: F32  # (n, c*d)
    z: F32  # (n, c*d), bias B[t mod r] already added

    @property
    def stop(self) -> int:
        return self.start + int(self.a.shape[0])

    def between(self, lo: int, hi: int) -> TailRows:
        """The rows of positions [lo, hi), which must all be held."""
        assert self.start <= lo <= hi <= self.stop, (self.start, lo, hi, self.stop)
        sl = slice(lo - self.start, hi - self.start)
        return TailRows(start=lo, a=self.a[sl].copy(), z=self.z[sl].copy())

    def extended(self, a: F32, z: F32) -> TailRows:
        """These rows followed by new rows for positions [stop, stop + len(a))."""
        assert a.shape == z.shape and a.shape[1:] == self.a.shape[1:], (a.shape, self.a.shape)
        return TailRows(
            start=self.start, a=np.concatenate([self.a, a]), z=np.concatenate([self.z, z])
        )

    def copy(self) -> TailRows:
        return TailRows(start=self.start, a=self.a.copy(), z=self.z.copy())


def _empty_tail(spec: LayerSpec, d: int) -> TailRows:
    start = tail_start(0, spec.ratio, spec.overlap)
    a, z = sentinel_rows(-start, spec.overlap * d)
    return TailRows(start=start, a=a, z=z)


@attrs.frozen(kw_only=True)
class LayerState:
    """One layer's resume state (see the module docstring for the rows each field holds)."""

    spec: LayerSpec
    window_start: int  # absolute position of window[0]
    window: F32  # (n_w, head_dim) latent kv after norm and rope, read as K and V
    entries: F32  # (n_e, head_dim) K_j, j = 0 .. n_e-1; always empty for SWA
    tail: TailRows | None  # main compressor; None for SWA
    index_keys: F32 | None  # (n_e, index_dim) KI_j; CSA only
    index_tail: TailRows | None  # indexer compressor, rows of width 2*index_dim; CSA only

    @classmethod
    def empty(cls, cfg: Config, spec: LayerSpec) -> LayerState:
        """The state at P = 0: no rows, sentinel-only r = 4 tails."""
        compressed = spec.overlap > 0
        return cls(
            spec=spec,
            window_start=0,
            window=np.zeros((0, cfg.head_dim), dtype=np.float32),
            entries=np.zeros((0, cfg.head_dim), dtype=np.float32),
            tail=_empty_tail(spec, cfg.head_dim) if compressed else None,
            index_keys=np.zeros((0, cfg.index_dim), np.float32) if spec.has_indexer else None,
            index_tail=_empty_tail(spec, cfg.index_dim) if spec.has_indexer else None,
        )

    def resume_at(self, prefix_tokens: int, cfg: Config) -> LayerState:
        """The minimal state at P, cut from a state that holds at least those rows."""
        p, spec = prefix_tokens, self.spec
        w0 = window_start(p, cfg.window_tokens)
        assert self.window_start <= w0 and p <= self.window_start + self.window.shape[0], (w0, p)
        window = self.window[w0 - self.window_start : p - self.window_start].copy()
        n_e = p // spec.ratio if spec.ratio else 0
        assert n_e <= self.entries.shape[0], (n_e, self.entries.shape)
        t0 = tail_start(p, spec.ratio, spec.overlap) if spec.ratio else 0
        return LayerState(
            spec=spec,
            window_start=w0,
            window=window,
            entries=self.entries[:n_e].copy(),
            tail=self.tail.between(t0, p) if self.tail is not None else None,
            index_keys=self.index_keys[:n_e].copy() if self.index_keys is not None else None,
            index_tail=self.index_tail.between(t0, p) if self.index_tail is not None else None,
        )

    def sizes(self) -> SizeTable:
        """Row counts per object kind held (section 6's units)."""
        out = {"window": self.window.shape[0]}
        if self.spec.ratio:
            out["entries"] = self.entries.shape[0]
        if self.tail is not None:
            out["tail"] = self.tail.a.shape[0]
        if self.index_keys is not None and self.index_tail is not None:
            out["index_keys"] = self.index_keys.shape[0]
            out["index_tail"] = self.index_tail.a.shape[0]
        return out

    def copy(self) -> LayerState:
        return attrs.evolve(
            self,
            window=self.window.copy(),
            entries=self.entries.copy(),
            tail=self.tail.copy() if self.tail is not None else None,
            index_keys=self.index_keys.copy() if self.index_keys is not None else None,
            index_tail=self.index_tail.copy() if self.index_tail is not None else None,
        )


@attrs.frozen(kw_only=True)
class ModelState:
    """The resume state of every layer after `prefix_tokens` tokens (section 6)."""

    prefix_tokens: int
    layers: tuple[LayerState, ...]

    @classmethod
    def empty(cls, cfg: Config) -> ModelState:
        return cls(
            prefix_tokens=0, layers=tuple(LayerState.empty(cfg, s) for s in cfg.layer_specs())
        )

    def resume_at(self, prefix_tokens: int, cfg: Config) -> ModelState:
        """The minimal state at P <= prefix_tokens (rows must be held, see LayerState)."""
        assert 0 <= prefix_tokens <= self.prefix_tokens, (prefix_tokens, self.prefix_tokens)
        layers = tuple(layer.resume_at(prefix_tokens, cfg) for layer in self.layers)
        return ModelState(prefix_tokens=prefix_tokens, layers=layers)

    def sizes(self) -> tuple[SizeTable, ...]:
        return tuple(layer.sizes() for layer in self.layers)

    def copy(self) -> ModelState:
        return ModelState(
            prefix_tokens=self.prefix_tokens, layers=tuple(x.copy() for x in self.layers)
        )


def expected_sizes(cfg: Config, prefix_tokens: int) -> tuple[SizeTable, ...]:
    """Section 6's table, literally: the rows of each object kind needed at P."""
    p, out = prefix_tokens, []
    for spec in cfg.layer_specs():
        sizes = {"window": min(p, cfg.window_tokens - 1)}
        if spec.ratio:
            sizes["entries"] = p // spec.ratio
            sizes["tail"] = (spec.ratio if spec.overlap == 2 else 0) + p % spec.ratio
        if spec.has_indexer:
            sizes["index_keys"] = p // spec.ratio
            sizes["index_tail"] = sizes["tail"]
        out.append(sizes)
    return tuple(out)
