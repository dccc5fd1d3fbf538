"""Learned gated pooling compressor (docs/v4_cache.md section 2, and section 7's chunking rule).

Between block boundaries the compressor keeps the raw per-token rows (a_t, z_t), never
partial sums. A chunk is processed by appending its rows to the saved tail and emitting
every block whose last token lies in the chunk; each block is pooled from scratch with
one fixed-shape softmax, so the entry is the same however the tokens were chunked.
"""

from __future__ import annotations

import numpy as np

from hkv_exec_ref.tiny_v4.config import LayerSpec
from hkv_exec_ref.tiny_v4.numerics import F32, I64, RopeTable, exp32, proj, rms_norm, seq_sum, xp_of
from hkv_exec_ref.tiny_v4.state import TailRows
from hkv_exec_ref.tiny_v4.weights import CompressorWeights


def compressor_rows(h: F32, positions: I64, cw: CompressorWeights) -> tuple[F32, F32]:
    """a_t = x_t @ W_kv and z_t = x_t @ W_gate + B[t mod r], t ABSOLUTE (section 2)."""
    ratio = cw.bias.shape[0]
    assert h.shape[0] == positions.shape[0] and ratio > 0, (h.shape, positions.shape)
    a = proj(h, cw.w_kv)
    z = proj(h, cw.w_gate) + cw.bias[xp_of(cw.bias).asarray(positions % ratio)]
    return a, z


def pool_block(rows: TailRows, block: int, spec: LayerSpec, d: int) -> F32:
    """C_j: per-channel softmax of z over the pool window's slots, weighted sum of a.

    With overlap c, slot group k (k = 0 .. c-1) holds part k (columns k*d .. (k+1)*d) of
    the r rows of block j-c+1+k; for r = 4 that is the first half of block j-1 then the
    second half of block j. Rows before position 0 are the sentinel (a = 0, z = -inf).
    """
    r, c = spec.ratio, spec.overlap
    groups = [rows.between((block - c + 1 + k) * r, (block - c + 2 + k) * r) for k in range(c)]
    a = np.concatenate([g.a[:, k * d : (k + 1) * d] for k, g in enumerate(groups)])
    z = np.concatenate([g.z[:, k * d : (k + 1) * d] for k, g in enumerate(groups)])
    assert a.shape == (c * r, d), (a.shape, c, r, d)
    weight = exp32(z - z.max(axis=0))
    pooled = seq_sum(weight * a, axis=0) / seq_sum(weight, axis=0)
    assert np.all(np.isfinite(pooled)), "block has no real row"
    return pooled


def finish_entry(
    pooled: F32, block: int, ratio: int, norm: F32, rope: RopeTable, eps: float
) -> F32:
    """K_j = RoPE(RMSNorm(C_j), position j*r), the block's FIRST token (section 2)."""
    normed = rms_norm(pooled[None, :], norm, eps)
    entry: F32 = rope.apply(normed, np.array([block * ratio], dtype=np.int64))[0]
    return entry


def advance(
    tail: TailRows,
    h: F32,
    positions: I64,
    cw: CompressorWeights,
    spec: LayerSpec,
    rope: RopeTable,
    eps: float,
) -> tuple[TailRows, F32]:
    """Append a chunk's rows to the saved tail; return (all rows, entries of completed blocks).

    The entries are those of blocks j with (j+1)*r - 1 in the chunk (section 5: a block is
    emitted at its own last token, before any query of that step reads).
    """
    assert positions.shape[0] >= 1 and int(positions[0]) == tail.stop, (positions, tail.stop)
    a, z = compressor_rows(h, positions, cw)
    rows = tail.extended(a, z)
    d = cw.norm.shape[0]
    blocks = range(tail.stop // spec.ratio, rows.stop // spec.ratio)
    entries = [
        finish_entry(pool_block(rows, j, spec, d), j, spec.ratio, cw.norm, rope, eps)
        for j in blocks
    ]
    new = np.stack(entries) if entries else xp_of(h).zeros((0, d), dtype=np.float32)
    assert new.dtype == np.float32, new.dtype
    return rows, new
