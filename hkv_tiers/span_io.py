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
(`export_rows` / `import_rows`); its length alone is checked against the layout
before a byte is used.  `read` / `write` / `decode` hand arrays out as
(n, layers, *entry_shape) views for tests and tools.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core import units
from hkv_core.executor import Executor, Run
from hkv_core.executor_tally import NUMPY_DTYPES
from hkv_core.layout import EntryKind, Layout, PoolSpec
from hkv_core.manager import Allocation

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
    return 0, units.tail_rows(hi, spec.compress_ratio)


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


def export(executor: Executor, layout: Layout, pools: tuple[PoolSpec, ...], kind: str, alloc: Allocation, lo: int,
           hi: int, out: NDArray[np.uint8]) -> None:
    """A record's payload copied from the pools into `out` (payload_bytes long), right after a step ended at
    `hi` (the working tails hold P = hi, and the pages of the window at hi are live)."""
    for spec, first, view in _views(layout, pools, kind, out, lo, hi):
        if spec.entry_kind is EntryKind.TAIL_ROW:
            runs = [(alloc.tail_pages[spec.name], 0, view.shape[1])]
        else:
            runs = _runs(spec, alloc.block_tables[spec.name], first, first + view.shape[1])
        executor.export_rows(spec.name, runs, view)


def load(executor: Executor, layout: Layout, pools: tuple[PoolSpec, ...], kind: str, alloc: Allocation, lo: int,
         hi: int, payload: Any, last: bool) -> None:
    """Write a loaded record into the allocation's new rows (through its block tables, where its slots are):
    entries and window rows at positions the allocation covers (rows before it are the device hit's, equal by
    their keys), tail rows into the snapshot
    pages of a retained boundary at `hi` and, for the `last` point, into the working tail pages."""
    start = alloc.start_tokens
    for spec, first, view in _views(layout, pools, kind, payload, lo, hi):
        if spec.entry_kind is EntryKind.TAIL_ROW:
            pages = [alloc.snapshots[hi][spec.name]] if spec.name in alloc.snapshots.get(hi, {}) else []
            for page in pages + ([alloc.tail_pages[spec.name]] if last else []):
                executor.import_rows(spec.name, [(page, 0, view.shape[1])], view)
            continue
        base = start if spec.entry_kind is EntryKind.WINDOW_ROW else start // spec.compress_ratio
        skip = max(0, base - first)  # window rows before the allocation
        runs = _runs(spec, alloc.block_tables[spec.name], first + skip, first + view.shape[1])
        executor.import_rows(spec.name, runs, view[:, skip:])


@attrs.frozen(kw_only=True)
class Load:
    """One fetched record to write into an allocation (see `load`)."""

    kind: str
    lo: int
    hi: int
    payload: Any = attrs.field(eq=False, repr=False)
    last: bool


def load_all(executor: Executor, layout: Layout, pools: tuple[PoolSpec, ...], alloc: Allocation,
             loads: Sequence[Load], workers: ThreadPoolExecutor | None = None) -> None:
    """`load` every record, on `workers` when given (records write disjoint rows - windows of nearby points
    overlap only with equal bytes - and numpy copies run without the GIL), waiting for all; the first error
    is raised after every write has ended."""
    if workers is None or len(loads) < 2:
        for r in loads:
            load(executor, layout, pools, r.kind, alloc, r.lo, r.hi, r.payload, r.last)
        return
    jobs = [workers.submit(load, executor, layout, pools, r.kind, alloc, r.lo, r.hi, r.payload, r.last)
            for r in loads]
    wait(jobs)
    for job in jobs:
        job.result()


# ---------------------------------------------------------------- arrays (tests and tools)


def read(executor: Executor, layout: Layout, pools: tuple[PoolSpec, ...], kind: str, alloc: Allocation, lo: int,
         hi: int) -> Arrays:
    """A record's arrays, (n, layers, *entry_shape) per pool (see `export`)."""
    payload = np.empty(payload_bytes(layout, pools, kind, lo, hi), np.uint8)
    export(executor, layout, pools, kind, alloc, lo, hi, payload)
    return decode(layout, pools, kind, payload, lo, hi)


def decode(layout: Layout, pools: tuple[PoolSpec, ...], kind: str, payload: Any, lo: int, hi: int) -> Arrays:
    """The arrays a payload holds, (n, layers, *entry_shape) views; ValueError when its length is not the
    layout's."""
    return {spec.name: np.swapaxes(view, 0, 1) for spec, _, view in _views(layout, pools, kind, payload, lo, hi)}


def encode(pools: tuple[PoolSpec, ...], kind: str, arrays: Arrays) -> bytes:
    """The payload of arrays shaped (n, layers, *entry_shape): page order, layout order."""
    return b"".join(np.ascontiguousarray(np.swapaxes(arrays[spec.name], 0, 1)).tobytes()
                    for spec in pools_of(pools, kind))


def write(executor: Executor, layout: Layout, pools: tuple[PoolSpec, ...], kind: str, alloc: Allocation, lo: int,
          hi: int, arrays: Arrays, last: bool) -> None:
    """`load` of the payload `arrays` encode to."""
    load(executor, layout, pools, kind, alloc, lo, hi, encode(pools, kind, arrays), last)
