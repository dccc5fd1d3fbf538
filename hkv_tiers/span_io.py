"""Block and point records: what a tier stores of a prefix, moved between the pools and bytes.

A tier holds a prefix as two kinds of record (docs/tiers.md):

- a **block** record per block [lo, hi): the compressed entries of every
  compressed-entry pool (compressed KV, indexer keys), entries [lo // r, hi // r);
- a **point** record at a block boundary P: the window rows of every window pool,
  positions [P - W + 1, P) (the group's W), and the tail rows at P of every
  tail pool (compressor and indexer tails).

Block records 0 .. k-1 and the point record at P = k * block_tokens are every
object the hit rule needs at P, each kind of every group: a tier never serves a
resume point with a part missing.  A payload is, per pool in layout order, its
rows as (layers, n, *entry_shape) in the pool's dtype - page order, so the
executor moves each contiguous run of a page with one strided copy
(the StoreRecord / LoadRecord ops of a plan the manager issues: `store_rows`,
`load_rows`, `run_store`, `run_load`); its length alone is checked against the layout
before a byte is used.  `read` / `write` / `decode` hand arrays out as
(n, layers, *entry_shape) views for tests and tools.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hkv_core import units
from hkv_core.executor import Executor, Run
from hkv_core.executor_tally import NUMPY_DTYPES
from hkv_core.layout import EntryKind, Layout, PoolSpec
from hkv_core.manager import Allocation, CacheManager
from hkv_core.plan import Completion, RecordRows

Arrays = dict[str, NDArray[Any]]  # pool name -> (n, layers, *entry_shape)
BLOCK, POINT = "block_entries", "resume_point"  # the two record kinds (the record header's `kind`)
KINDS = (BLOCK, POINT)
_DTYPES = {name: np.dtype(t) for name, t in NUMPY_DTYPES.items()}


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
    return 0, spec.point_entries(hi)  # a snapshot: tail rows, or the one entry of a recurrent state


def token_range(layout: Layout, kind: str, lo: int, hi: int) -> tuple[int, int]:
    """The token range a record's header names: the block, or the widest window a point holds."""
    if kind == BLOCK:
        return lo, hi
    return units.window_start_token(hi, max((g.window_tokens for g in layout.groups), default=0)), hi


@functools.cache
def pools_of(pools: tuple[PoolSpec, ...], kind: str) -> tuple[PoolSpec, ...]:
    return tuple(spec for spec in pools if kind_of(spec) == kind)


def _pieces(layout: Layout, pools: tuple[PoolSpec, ...], kind: str, lo: int,
            hi: int) -> tuple[list[tuple[PoolSpec, int, int, int, np.dtype[Any], tuple[int, ...]]], int]:
    """Per pool of the record (spec, first row, byte offset, bytes, dtype, page-order shape), and the total."""
    out, at = [], 0
    for spec in pools_of(pools, kind):
        first, stop = rows(layout, spec, lo, hi)
        dtype = _DTYPES[spec.dtype]
        shape = (spec.layer_count, stop - first, *spec.entry_shape)
        nbytes = math.prod(shape) * dtype.itemsize
        out.append((spec, first, at, nbytes, dtype, shape))
        at += nbytes
    return out, at


def payload_bytes(layout: Layout, pools: tuple[PoolSpec, ...], kind: str, lo: int, hi: int) -> int:
    """Payload bytes of a record."""
    return _pieces(layout, pools, kind, lo, hi)[1]


def _views(layout: Layout, pools: tuple[PoolSpec, ...], kind: str, payload: Any, lo: int,
           hi: int) -> list[tuple[PoolSpec, int, NDArray[Any]]]:
    """Each pool's page-order view of a payload buffer (writable when the buffer is)."""
    pieces, expected = _pieces(layout, pools, kind, lo, hi)
    if len(payload) != expected:
        raise ValueError(f"a {kind} record of [{lo}, {hi}) holds {expected} bytes, the payload {len(payload)}")
    flat = np.frombuffer(payload, np.uint8) if not isinstance(payload, np.ndarray) else payload
    return [(spec, first, flat[at:at + nbytes].view(dtype).reshape(shape))
            for spec, first, at, nbytes, dtype, shape in pieces]


def _runs(spec: PoolSpec, table: NDArray[np.int32], first: int, stop: int) -> list[Run]:
    """Rows [first, stop) of a block-table pool as (page, first entry, stop entry) runs."""
    per_page, out = spec.entries_per_page, []
    for index in range(first // per_page, -(-stop // per_page)):
        page = int(table[index])
        assert page != units.NULL_PAGE, f"{spec.name}: a record row on the NULL page"
        out.append((page, max(first, index * per_page) - index * per_page, min(stop, (index + 1) * per_page)
                    - index * per_page))
    return out


def store_rows(layout: Layout, pools: tuple[PoolSpec, ...], kind: str, alloc: Allocation, lo: int, hi: int,
               record: str) -> list[RecordRows]:
    """Where a record's payload comes from, right after a step ended at `hi` (the working tails hold P = hi,
    and the pages of the window at hi are live): per pool, its row runs and their place in the payload - what
    `CacheManager.plan_store` turns into a plan."""
    out = []
    for spec, first, at, _, _, shape in _pieces(layout, pools, kind, lo, hi)[0]:
        if not shape[1]:
            continue
        if spec.snapshot:
            runs = [(alloc.tail_pages[spec.name], 0, shape[1])]
        else:
            runs = _runs(spec, alloc.block_tables[spec.name], first, first + shape[1])
        out.append(RecordRows(pool=spec.name, runs=runs, record=record, offset=at))
    return out


def load_rows(layout: Layout, pools: tuple[PoolSpec, ...], kind: str, alloc: Allocation, lo: int, hi: int,
              record: str, last: bool) -> list[RecordRows]:
    """Where a loaded record's payload goes in the allocation's new rows (through its block tables): entries
    and window rows at positions the allocation covers (rows before it are the device hit's, equal by their
    keys), tail rows into the snapshot pages of a retained boundary at `hi` and, for the `last` point, into the
    working tail pages - what `CacheManager.plan_load` turns into a plan."""
    start, out = alloc.start_tokens, []
    for spec, first, at, _, _, shape in _pieces(layout, pools, kind, lo, hi)[0]:
        n = shape[1]
        if not n:
            continue
        if spec.snapshot:
            pages = [alloc.snapshots[hi][spec.name]] if spec.name in alloc.snapshots.get(hi, {}) else []
            out += [RecordRows(pool=spec.name, runs=[(page, 0, n)], record=record, offset=at)
                    for page in pages + ([alloc.tail_pages[spec.name]] if last else [])]
            continue
        base = start if spec.entry_kind is EntryKind.WINDOW_ROW else start // spec.compress_ratio
        skip = max(0, base - first)  # window rows before the allocation
        if skip < n:
            runs = _runs(spec, alloc.block_tables[spec.name], first + skip, first + n)
            out.append(RecordRows(pool=spec.name, runs=runs, record=record, offset=at, first_row=skip))
    return out


def buffer_of(payload: Any) -> NDArray[np.uint8]:
    """A payload (bytes, memoryview, uint8 array) as the 1-d uint8 array a record op names."""
    flat = payload if isinstance(payload, np.ndarray) else np.frombuffer(payload, np.uint8)
    return flat.reshape(-1).view(np.uint8)


def run_store(manager: CacheManager, executor: Executor, rid: int, rows: Sequence[RecordRows],
              buffers: dict[str, NDArray[np.uint8]]) -> None:
    """Copy `rows` into `buffers` through a plan the manager issued (the one path from the pools to a tier)."""
    if rows:
        executor.run(manager.plan_store(rid, rows), records=buffers)


def run_load(manager: CacheManager, executor: Executor, rid: int, rows: Sequence[RecordRows],
             buffers: dict[str, NDArray[np.uint8]]) -> Completion:
    """Copy `buffers` into `rows` through a plan the manager issued, settled by `complete` (a failed copy:
    the targets are RESERVED again, unwritten, for the engine to compute); the completion."""
    if not rows:
        return Completion()
    plan = manager.plan_load(rid, rows)
    try:
        done = executor.run(plan, records=buffers)
    except BaseException as err:
        manager.complete(plan.plan_id, Completion(ok=False, error=f"{type(err).__name__}: {err}"))
        raise
    manager.complete(plan.plan_id, done)
    return done


# ---------------------------------------------------------------- arrays (tests and tools)


def read(manager: CacheManager, executor: Executor, rid: int, layout: Layout, pools: tuple[PoolSpec, ...], kind: str,
         alloc: Allocation, lo: int, hi: int) -> Arrays:
    """A record's arrays, (n, layers, *entry_shape) per pool, copied out of request `rid`'s pages by a store
    plan (see `store_rows`)."""
    payload = np.zeros(payload_bytes(layout, pools, kind, lo, hi), np.uint8)
    run_store(manager, executor, rid, store_rows(layout, pools, kind, alloc, lo, hi, "r"), {"r": payload})
    return decode(layout, pools, kind, payload, lo, hi)


def decode(layout: Layout, pools: tuple[PoolSpec, ...], kind: str, payload: Any, lo: int, hi: int) -> Arrays:
    """The arrays a payload holds, (n, layers, *entry_shape) views; ValueError when its length is not the
    layout's."""
    return {spec.name: np.swapaxes(view, 0, 1) for spec, _, view in _views(layout, pools, kind, payload, lo, hi)}


def encode(pools: tuple[PoolSpec, ...], kind: str, arrays: Arrays) -> bytes:
    """The payload of arrays shaped (n, layers, *entry_shape): page order, layout order."""
    return b"".join(np.ascontiguousarray(np.swapaxes(arrays[spec.name], 0, 1)).tobytes()
                    for spec in pools_of(pools, kind))


def write(manager: CacheManager, executor: Executor, rid: int, layout: Layout, pools: tuple[PoolSpec, ...],
          kind: str, alloc: Allocation, lo: int, hi: int, arrays: Arrays, last: bool) -> Completion:
    """Load the payload `arrays` encode to into request `rid`'s allocation by a load plan (see `load_rows`)."""
    rows = load_rows(layout, pools, kind, alloc, lo, hi, "r", last)
    return run_load(manager, executor, rid, rows, {"r": buffer_of(encode(pools, kind, arrays))})
