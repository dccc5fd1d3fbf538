"""Custom CUDA kernels (`kernels/*.cu`) and the wrappers that launch them.

The executor moves pages with CuPy's own indexing; the kernels here are
alternatives that `benchmarks/bench_cuda.py` measures beside it (a custom
kernel goes into the executor only where a measurement shows it is needed).
CI compiles every `.cu` file with `nvcc` (tests/executor/test_cuda_kernels.py).

`gather_runs` / `scatter_runs` copy runs `(page, first, stop)` of a pool to or
from a contiguous buffer laid out as `export_rows` lays out its host array:
`(layers, n, *entry_shape)`, n the runs' total entries.  Each (run, layer) is one
contiguous byte range of the pool; `byte_runs` lists them, and one launch copies
them all.  On NumPy (the CPU stand-in) the same ranges are copied one by one.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.executor import Run

__all__ = ["ByteRuns", "byte_runs", "gather_runs", "kernel_sources", "load_module", "scatter_runs"]

KERNEL_DIR = Path(__file__).parent / "kernels"
THREADS_PER_BLOCK = 256
BYTES_PER_BLOCK_PART = 64 << 10  # a run is split over blockIdx.y in parts of about this many bytes
MAX_GRID_Y = 65_535  # CUDA's limit on gridDim.y
MAX_GRID_X = 1 << 20  # blocks along x; more runs than this are walked grid-stride


def kernel_sources() -> list[Path]:
    """Every `.cu` file of the package, sorted."""
    return sorted(KERNEL_DIR.glob("*.cu"))


@functools.cache
def load_module(cupy: Any) -> Any:
    """A `cupy.RawModule` of page_gather.cu (compiled by NVRTC on first use; CuPy caches the binary)."""
    code = (KERNEL_DIR / "page_gather.cu").read_text()
    return cupy.RawModule(code=code)


@attrs.frozen
class ByteRuns:
    """Byte ranges to copy: `pool_offsets[i]` in the pool, `buffer_offsets[i]` in the buffer, `lengths[i]` bytes
    (int64 arrays of the array module the pool lives in)."""

    pool_offsets: Any
    buffer_offsets: Any
    lengths: Any
    count: int
    max_bytes: int
    total_bytes: int


def byte_runs(xp: Any, pool: Any, runs: Sequence[Run]) -> ByteRuns:
    """The byte ranges of `runs` of a C-contiguous pool `(pages, layers, entries, *entry)`, ordered as
    `(layers, n, *entry)` in the buffer: layer by layer, runs in order within a layer."""
    assert pool.flags.c_contiguous, "pools are C-contiguous"
    pages, layers, entries = pool.shape[:3]
    entry_bytes = int(np.prod(pool.shape[3:], dtype=np.int64)) * pool.itemsize
    table = np.asarray(runs, np.int64).reshape(-1, 3)
    page, first, stop = table[:, 0], table[:, 1], table[:, 2]
    assert np.all((page >= 0) & (page < pages) & (first >= 0) & (first <= stop) & (stop <= entries)), table
    width = stop - first  # entries per run
    layer = np.arange(layers, dtype=np.int64)[:, None]
    pool_offsets = ((page * layers + layer) * entries + first) * entry_bytes
    buffer_offsets = (layer * int(width.sum()) + np.cumsum(width) - width) * entry_bytes
    lengths = np.broadcast_to(width * entry_bytes, pool_offsets.shape)
    keep = lengths.ravel() > 0
    at_pool, at_buffer, sizes = (xp.asarray(np.ascontiguousarray(a.ravel()[keep]))
                                 for a in (pool_offsets, buffer_offsets, lengths))
    return ByteRuns(pool_offsets=at_pool, buffer_offsets=at_buffer, lengths=sizes, count=int(keep.sum()),
                    max_bytes=int(lengths.max(initial=0)), total_bytes=int(lengths.sum()))


def gather_runs(xp: Any, pool: Any, runs: Sequence[Run] | ByteRuns, out: Any) -> None:
    """Copy `runs` of `pool` into `out` (C-contiguous, `(layers, n, *entry)` bytes) in one kernel launch on the
    current stream (`xp` is cupy; with numpy, run by run on the CPU)."""
    _launch(xp, "gather_runs", pool, runs, out)


def scatter_runs(xp: Any, pool: Any, runs: Sequence[Run] | ByteRuns, src: Any) -> None:
    """Copy `src` (C-contiguous, `(layers, n, *entry)` bytes) into `runs` of `pool`: the inverse of gather_runs."""
    _launch(xp, "scatter_runs", pool, runs, src)


def _launch(xp: Any, name: str, pool: Any, runs: Sequence[Run] | ByteRuns, buffer: Any) -> None:
    plan = runs if isinstance(runs, ByteRuns) else byte_runs(xp, pool, runs)
    assert buffer.flags.c_contiguous and buffer.nbytes == plan.total_bytes, (buffer.shape, plan.total_bytes)
    if plan.count == 0:
        return
    if xp is np:
        _copy_on_host(name, pool, plan, buffer)
        return
    parts = min(MAX_GRID_Y, max(1, -(-plan.max_bytes // BYTES_PER_BLOCK_PART)))
    grid = (min(plan.count, MAX_GRID_X), parts)
    args = (pool, buffer, plan.pool_offsets, plan.buffer_offsets, plan.lengths, np.int64(plan.count))
    load_module(xp).get_function(name)(grid, (THREADS_PER_BLOCK,), args)


def _copy_on_host(name: str, pool: NDArray[Any], plan: ByteRuns, buffer: NDArray[Any]) -> None:
    """The kernel's copies on the CPU, one byte range at a time (the NumPy stand-in)."""
    pool_bytes, buffer_bytes = pool.reshape(-1).view(np.uint8), buffer.reshape(-1).view(np.uint8)
    for at_pool, at_buffer, length in zip(plan.pool_offsets.tolist(), plan.buffer_offsets.tolist(),
                                          plan.lengths.tolist(), strict=True):
        if name == "gather_runs":
            buffer_bytes[at_buffer:at_buffer + length] = pool_bytes[at_pool:at_pool + length]
        else:
            pool_bytes[at_pool:at_pool + length] = buffer_bytes[at_buffer:at_buffer + length]
