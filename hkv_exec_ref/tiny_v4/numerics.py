"""Canonical float32 primitives whose bits never depend on batch shape (docs/v4_cache.md section 7).

Every reduction here is a strictly sequential running sum (np.add.accumulate), and
every other step is an element-wise IEEE operation (+, -, *, /, sqrt), which numpy
rounds correctly whatever the array's shape, stride or alignment. Hence the result for
one row is the same whether that row is computed alone or inside a batch of any size;
`tests/e2e/test_tiny_v4_exact.py` checks this claim directly. `np.exp` is only ever
called through `exp32`, on arrays whose shape is fixed by the position being computed
(one block, one query), never on a batch-shaped array.

The same functions run on a GPU when given CuPy arrays (hkv_exec_cuda; docs/cuda_executor.md):
`xp_of` picks the array module from the arrays themselves (CuPy is never imported here), NumPy
functions dispatch to CuPy through its `__array_function__` / `__array_ufunc__`, and arrays are
only ever created with the module of the arrays at hand.  There the running sum is an explicit
loop of element-wise adds (`seq_sum_loop`), the same sequence of roundings as NumPy's.
"""

from __future__ import annotations

import sys
from typing import Any

import attrs
import numpy as np
from numpy.typing import NDArray

F32 = NDArray[np.float32]
I64 = NDArray[np.int64]
ONE = np.float32(1.0)
PROJ_ROWS_MAX = 256  # rows per temporary product in `proj` (memory bound only)


def xp_of(*arrays: Any) -> Any:
    """The array module of `arrays`: CuPy when any is a CuPy array (CuPy already imported by its user), else NumPy."""
    cupy = sys.modules.get("cupy")
    return np if cupy is None else cupy.get_array_module(*arrays)


def to_host(array: Any) -> Any:
    """A NumPy copy of a CuPy array; a NumPy array as it is."""
    return array.get() if xp_of(array) is not np else array


def arrays_on(tree: Any, xp: Any) -> Any:
    """`tree` (attrs records, tuples, arrays) with every NumPy array moved to array module `xp` (a copy of the
    structure; NumPy to NumPy returns the same arrays)."""
    if isinstance(tree, np.ndarray):
        return xp.asarray(tree)
    if xp_of(tree) is not np:  # a device array (CuPy): to `xp` through the host unless it is there already
        return tree if xp is xp_of(tree) else xp.asarray(to_host(tree))
    if isinstance(tree, tuple):
        return tuple(arrays_on(item, xp) for item in tree)
    if attrs.has(type(tree)):
        return attrs.evolve(tree, **{f.alias: arrays_on(getattr(tree, f.name), xp)
                                     for f in attrs.fields(type(tree)) if f.init})
    return tree


def seq_sum_loop(x: F32, axis: int) -> F32:
    """`seq_sum` as a Python loop of element-wise adds: any array module, the same roundings in the same order."""
    xp = xp_of(x)
    out: F32 = xp.take(x, 0, axis=axis).astype(np.float32)
    for i in range(1, x.shape[axis]):
        out = out + xp.take(x, i, axis=axis)
    return out


def seq_sum(x: F32, axis: int) -> F32:
    """Sum along `axis` in index order: ((x0 + x1) + x2) + ... (never pairwise or SIMD-split).

    `np.add.accumulate` is the running sum r_i = r_(i-1) + x_i by definition, so its last
    element is the strictly sequential sum, done in C.
    """
    assert x.dtype == np.float32 and x.shape[axis] >= 1, (x.dtype, x.shape, axis)
    if xp_of(x) is not np:
        return seq_sum_loop(x, axis)
    running = np.add.accumulate(x, axis=axis, dtype=np.float32)
    out: F32 = np.take(running, -1, axis=axis)
    return out


def proj(x: F32, w: F32) -> F32:
    """Row-wise x @ w: out[n] = sum_i x[n, i] * w[i], accumulated in order of i.

    Equal, row by row, to the canonical `(v[:, None] * w).sum(0)` of section 7, and
    independent of how many rows are stacked in `x` (rows are processed in slabs of
    PROJ_ROWS_MAX only to bound the temporary (rows, d_in, d_out) product).
    """
    assert x.ndim == 2 and w.ndim == 2 and x.shape[1] == w.shape[0], (x.shape, w.shape)
    slabs = [
        seq_sum(x[lo : lo + PROJ_ROWS_MAX, :, None] * w[None, :, :], axis=1)
        for lo in range(0, x.shape[0], PROJ_ROWS_MAX)
    ]
    out: F32 = np.concatenate(slabs) if slabs else xp_of(w).zeros((0, w.shape[1]), np.float32)
    return out


def rms_norm(x: F32, gain: F32, eps: float) -> F32:
    """RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) * gain."""
    assert x.shape[-1] == gain.shape[0], (x.shape, gain.shape)
    mean_sq = seq_sum(x * x, axis=-1) / np.float32(x.shape[-1])
    inv = ONE / np.sqrt(mean_sq + np.float32(eps))
    out: F32 = (x * inv[..., None]) * gain
    return out


def exp32(x: F32) -> F32:
    """Element-wise exp on a contiguous float32 copy (one code path in numpy's ufunc loop)."""
    out: F32 = np.exp(xp_of(x).ascontiguousarray(x, dtype=np.float32))  # np.ascontiguousarray never dispatches
    assert out.dtype == np.float32
    return out


class RopeTable:
    """cos / sin of position * base^(-2i/dims), precomputed in float64, stored as float32.

    Rotation pairs the two halves of the rope part (the LAST `dims` dims of a vector).
    """

    def __init__(self, *, dims: int, base: float, max_positions: int, xp: Any = np) -> None:
        assert dims % 2 == 0 and dims > 0, dims
        inv_freq = base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
        angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
        self.dims = dims
        self.cos: F32 = xp.asarray(np.cos(angles).astype(np.float32))
        self.sin: F32 = xp.asarray(np.sin(angles).astype(np.float32))

    def apply(self, x: F32, positions: I64, *, inverse: bool = False) -> F32:
        """Rotate x[n, ..., -dims:] by +positions[n] (or by -positions[n] when `inverse`)."""
        assert x.shape[0] == positions.shape[0], (x.shape, positions.shape)
        assert positions.size == 0 or int(positions.max()) < self.cos.shape[0], (
            "raise max_positions"
        )
        lead = (positions.shape[0],) + (1,) * (x.ndim - 2) + (self.dims // 2,)
        at = xp_of(self.cos).asarray(positions)
        cos = self.cos[at].reshape(lead)
        sin = self.sin[at].reshape(lead)
        sin = -sin if inverse else sin
        split = x.shape[-1] - self.dims
        half = split + self.dims // 2
        x1, x2 = x[..., split:half], x[..., half:]
        rotated = (x[..., :split], x1 * cos - x2 * sin, x1 * sin + x2 * cos)
        return np.concatenate(rotated, axis=-1)
