"""Block and point records: what a tier stores of a prefix, moved between the pools and bytes.

A tier holds a prefix as two kinds of record (docs/tiers.md):

- a **block** record per block [lo, hi): the compressed entries of every
  compressed-entry pool (compressed KV, indexer keys), entries [lo // r, hi // r);
- a **point** record at a block boundary P: the window rows of every window pool,
  positions [P - W + 1, P) (the group's W), and the tail rows at P of every
  tail pool (compressor and indexer tails).

Block records 0 .. k-1 and the point record at P = k * block_tokens are every
object the hit rule needs at P, each kind of every group: a tier never serves a
resume point with a part missing.  Arrays are (n, layers, *entry_shape) in the
pool's dtype; a payload is their bytes back to back in layout order, so its
length alone is checked against the layout before a byte is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hkv_core import units
from hkv_core.executor import Executor
from hkv_core.layout import EntryKind, Layout, PoolSpec
from hkv_core.manager import Allocation
from hkv_exec_ref.executor import NUMPY_DTYPES

Arrays = dict[str, NDArray[Any]]  # pool name -> (n, layers, *entry_shape)
BLOCK, POINT = "block_entries", "resume_point"  # the two record kinds (the record header's `kind`)
KINDS = (BLOCK, POINT)


def kind_of(spec: PoolSpec) -> str:
    """Which record kind holds a pool's rows."""
    return BLOCK if spec.entry_kind is EntryKind.COMPRESSED_ENTRY else POINT


def rows(layout: Layout, spec: PoolSpec, lo: int, hi: int) -> tuple[int, int]:
    """Rows [first, stop) of `spec` in the record of [lo, hi) (block) or of P = hi (point; tails: row indexes
    in the tail page)."""
    if spec.entry_kind is EntryKind.COMPRESSED_ENTRY:
        return lo // spec.compress_ratio, hi // spec.compress_ratio
    if spec.entry_kind is EntryKind.WINDOW_ROW:
        return units.window_start_token(hi, layout.group(spec.group_name).window_tokens), hi
    return 0, units.tail_rows(hi, spec.compress_ratio)


def token_range(layout: Layout, kind: str, lo: int, hi: int) -> tuple[int, int]:
    """The token range a record's header names: the block, or the widest window a point holds."""
    if kind == BLOCK:
        return lo, hi
    return units.window_start_token(hi, max((g.window_tokens for g in layout.groups), default=0)), hi


def pools_of(pools: Sequence[PoolSpec], kind: str) -> tuple[PoolSpec, ...]:
    return tuple(spec for spec in pools if kind_of(spec) == kind)


def shapes(layout: Layout, pools: Sequence[PoolSpec], kind: str, lo: int, hi: int) -> dict[str, tuple[int, ...]]:
    """Each pool's array shape in a record."""
    out = {}
    for spec in pools_of(pools, kind):
        first, stop = rows(layout, spec, lo, hi)
        out[spec.name] = (stop - first, spec.layer_count, *spec.entry_shape)
    return out


def payload_bytes(layout: Layout, pools: Sequence[PoolSpec], kind: str, lo: int, hi: int) -> int:
    """Payload bytes of a record."""
    return sum(int(np.prod(shape)) * np.dtype(NUMPY_DTYPES[spec.dtype]).itemsize
               for spec, shape in zip(pools_of(pools, kind), shapes(layout, pools, kind, lo, hi).values(),
                                      strict=True))


def encode(pools: Sequence[PoolSpec], kind: str, arrays: Arrays) -> bytes:
    """The payload: each pool's array bytes in layout order."""
    return b"".join(np.ascontiguousarray(arrays[spec.name]).tobytes() for spec in pools_of(pools, kind))


def decode(layout: Layout, pools: Sequence[PoolSpec], kind: str, payload: bytes | memoryview, lo: int,
           hi: int) -> Arrays:
    """The arrays a payload holds (views, no copy); ValueError when its length is not the layout's."""
    expected = payload_bytes(layout, pools, kind, lo, hi)
    if len(payload) != expected:
        raise ValueError(f"a {kind} record of [{lo}, {hi}) holds {expected} bytes, the payload {len(payload)}")
    out, at = {}, 0
    for spec in pools_of(pools, kind):
        dtype, shape = np.dtype(NUMPY_DTYPES[spec.dtype]), shapes(layout, pools, kind, lo, hi)[spec.name]
        count = int(np.prod(shape))
        out[spec.name] = np.frombuffer(payload, dtype, count, at).reshape(shape)
        at += count * dtype.itemsize
    return out


def _table_rows(executor: Executor, spec: PoolSpec, table: NDArray[np.int32], first: int,
                stop: int) -> NDArray[Any]:
    """Rows / entries [first, stop) of a block-table pool, every layer: (n, layers, *entry_shape)."""
    index = np.arange(first, stop, dtype=np.int64)
    pages = table.astype(np.int64)[index // spec.entries_per_page]
    assert np.all(pages != units.NULL_PAGE), f"{spec.name}: a record read from the NULL page"
    unique, back = np.unique(pages, return_inverse=True)
    data = executor.read(spec.name, unique)  # (pages, layers, per_page, *entry)
    return np.ascontiguousarray(data[back.ravel(), :, index % spec.entries_per_page])


def read(executor: Executor, layout: Layout, pools: Sequence[PoolSpec], kind: str, alloc: Allocation, lo: int,
         hi: int) -> Arrays:
    """A record's arrays read from the pools right after a step ended at `hi` (the working tails hold P = hi,
    and the pages of the window at hi are live)."""
    out: Arrays = {}
    for spec in pools_of(pools, kind):
        first, stop = rows(layout, spec, lo, hi)
        if spec.entry_kind is EntryKind.TAIL_ROW:
            page = executor.read(spec.name, [alloc.tail_pages[spec.name]])[0]  # (layers, per_page, *entry)
            out[spec.name] = np.ascontiguousarray(np.swapaxes(page[:, :stop], 0, 1))
        else:
            out[spec.name] = _table_rows(executor, spec, alloc.block_tables[spec.name], first, stop)
    return out


def write(executor: Executor, layout: Layout, pools: Sequence[PoolSpec], kind: str, alloc: Allocation, lo: int,
          hi: int, arrays: Arrays, last: bool) -> None:
    """Write a loaded record into the allocation's new slots: entries and window rows at positions the
    allocation covers (rows before it are the device hit's, equal by their keys), tail rows into the snapshot
    pages of a retained boundary at `hi` and, for the `last` point, into the working tail pages."""
    start = alloc.start_tokens
    for spec in pools_of(pools, kind):
        values = arrays[spec.name]
        if spec.entry_kind is EntryKind.TAIL_ROW:
            pages = [alloc.snapshots[hi][spec.name]] if spec.name in alloc.snapshots.get(hi, {}) else []
            for page in pages + ([alloc.tail_pages[spec.name]] if last else []):
                executor.write(spec.name, page * spec.entries_per_page + np.arange(len(values)), values)
            continue
        first, stop = rows(layout, spec, lo, hi)
        base = start if spec.entry_kind is EntryKind.WINDOW_ROW else start // spec.compress_ratio
        skip = max(0, base - first)  # window rows before the allocation
        if stop > first + skip:
            executor.write(spec.name, alloc.slots[spec.name][first + skip - base:stop - base], values[skip:])
