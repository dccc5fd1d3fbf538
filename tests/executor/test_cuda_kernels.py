"""The custom CUDA kernels: every `.cu` file compiles for sm_90 with nvcc (no GPU needed), and the byte runs the
gather/scatter wrappers hand the kernel lay rows out exactly as `export_rows` / `import_rows` do: on the NumPy
stand-in (which copies the same byte ranges one by one) everywhere, and through the kernel itself on a GPU
(`-m gpu`; skipped without CuPy or a device)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from hkv_core.errors import MissingDependency, NoDevice
from hkv_core.executor import PoolBinding, Run, TrustingAuthority
from hkv_core.layout import Layout
from hkv_exec_cuda import Backend, CudaExecutor, cupy_backend, numpy_backend
from hkv_exec_cuda.kernels import KERNEL_DIR, byte_runs, gather_runs, kernel_sources, scatter_runs

NVCC = shutil.which("nvcc")
NVCC_TIMEOUT_S = 300
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: the CUDA toolkit is not installed here")
RUNS: list[Run] = [(3, 0, 4), (1, 2, 3), (5, 0, 0), (2, 1, 4)]  # whole page, part of one, empty, a tail


def nvcc(source: Path, out: Path, kind: str) -> subprocess.CompletedProcess[str]:
    assert NVCC is not None
    return subprocess.run([NVCC, "-arch=sm_90", kind, "-o", str(out), str(source)], capture_output=True, text=True,
                          timeout=NVCC_TIMEOUT_S, check=False)


def test_kernel_sources_lists_the_cu_files() -> None:
    sources = kernel_sources()
    assert sources, "no .cu file under hkv_exec_cuda/kernels"
    assert all(p.suffix == ".cu" and p.is_file() for p in sources)
    assert "page_gather.cu" in {p.name for p in sources}


@needs_nvcc
@pytest.mark.parametrize("source", kernel_sources(), ids=lambda p: p.name)
def test_kernel_compiles_for_sm90(source: Path, tmp_path: Path) -> None:
    cubin = tmp_path / (source.stem + ".cubin")
    done = nvcc(source, cubin, "--cubin")
    assert done.returncode == 0, f"nvcc failed on {source.name}:\n{done.stderr}"
    assert cubin.stat().st_size > 0


@needs_nvcc
def test_page_gather_exports_the_names_the_wrappers_launch(tmp_path: Path) -> None:
    ptx = tmp_path / "page_gather.ptx"
    done = nvcc(KERNEL_DIR / "page_gather.cu", ptx, "--ptx")
    assert done.returncode == 0, done.stderr
    text = ptx.read_text()
    for name in ("gather_runs", "scatter_runs"):  # extern "C": unmangled, as RawModule.get_function asks
        assert f".entry {name}(" in text
    assert "ld.global.nc.v4" in text and "st.global.v4" in text  # 16-byte vectors on the aligned path


def bound(backend: Backend, pages: int = 6) -> CudaExecutor:
    """An executor over tiny V4 pools filled with random bytes."""
    ex = CudaExecutor(backend, staging_bytes=1 << 16)
    ex.bind([PoolBinding(spec=s, pages=pages) for s in Layout.from_preset("tiny_v4").pools], TrustingAuthority())
    rng = np.random.default_rng(7)
    with ex.stream:  # the executor's stream does not wait for CUDA's default stream: fill on its own
        for array in ex.pools.values():
            raw = array.view(np.uint8)
            raw[...] = ex.xp.asarray(rng.integers(0, 256, raw.shape, np.uint8))
    ex.stream.synchronize()
    return ex


def gpu_backend() -> Backend:
    try:
        return cupy_backend()
    except (MissingDependency, NoDevice) as err:
        pytest.skip(f"no usable CUDA device: {err}")


def runs_of(array: Any) -> list[Run]:
    entries = array.shape[2]
    return [(p, min(f, entries), min(s, entries)) for p, f, s in RUNS]


def rows_like(array: Any, runs: list[Run]) -> NDArray[Any]:
    n = sum(stop - first for _, first, stop in runs)
    return np.empty((array.shape[1], n, *array.shape[3:]), array.dtype)


def host(array: Any) -> NDArray[Any]:
    out: NDArray[Any] = array.get() if hasattr(array, "get") else array  # a CuPy array's host copy, or itself
    return out


def check_gather_matches_export_rows(ex: CudaExecutor) -> None:
    for pool, array in ex.pools.items():
        expected = rows_like(array, runs_of(array))
        ex.export_rows(pool, runs_of(array), expected)
        got = ex.xp.empty(expected.shape, expected.dtype)
        with ex.stream:
            gather_runs(ex.xp, array, runs_of(array), got)
        ex.stream.synchronize()
        assert np.array_equal(host(got).view(np.uint8), expected.view(np.uint8)), pool


def check_scatter_matches_import_rows(ours: CudaExecutor, theirs: CudaExecutor) -> None:
    rng = np.random.default_rng(3)
    for pool, array in ours.pools.items():
        src = rows_like(array, runs_of(array))
        src.view(np.uint8)[...] = rng.integers(0, 256, src.view(np.uint8).shape, np.uint8)
        theirs.import_rows(pool, runs_of(array), src)
        with ours.stream:
            scatter_runs(ours.xp, array, runs_of(array), ours.xp.asarray(src))
        ours.stream.synchronize()
        every = range(array.shape[0])
        assert np.array_equal(ours.read(pool, every).view(np.uint8), theirs.read(pool, every).view(np.uint8)), pool


def test_gather_runs_matches_export_rows() -> None:
    check_gather_matches_export_rows(bound(numpy_backend()))


def test_scatter_runs_matches_import_rows() -> None:
    check_scatter_matches_import_rows(bound(numpy_backend()), bound(numpy_backend()))


@pytest.mark.gpu
def test_kernels_match_export_and_import_rows_on_the_gpu() -> None:
    backend = gpu_backend()
    check_gather_matches_export_rows(bound(backend))
    check_scatter_matches_import_rows(bound(backend), bound(backend))
    pool = backend.xp.arange(2 * 1 * 5 * 3, dtype=backend.xp.uint8).reshape(2, 1, 5, 3)  # the byte-by-byte path
    out = backend.xp.empty((1, 3, 3), backend.xp.uint8)
    gather_runs(backend.xp, pool, [(1, 1, 4)], out)
    assert np.array_equal(out.get(), pool.get()[1, :, 1:4])


def test_byte_runs_of_whole_pages_are_one_range_per_layer() -> None:
    pool = np.zeros((4, 3, 8, 2, 4), np.float32)  # (pages, layers, entries, *entry): 32-byte entries
    plan = byte_runs(np, pool, [(2, 0, 8), (1, 0, 8)])
    layer_bytes, page_bytes = 8 * 32, 3 * 8 * 32
    assert plan.count == 6 and plan.max_bytes == layer_bytes and plan.total_bytes == 2 * page_bytes
    assert plan.pool_offsets.tolist() == [2 * page_bytes, page_bytes, 2 * page_bytes + layer_bytes,
                                          page_bytes + layer_bytes, 2 * page_bytes + 2 * layer_bytes,
                                          page_bytes + 2 * layer_bytes]
    assert plan.buffer_offsets.tolist() == [i * layer_bytes for i in range(6)]
    assert set(plan.lengths.tolist()) == {layer_bytes}


def test_misaligned_runs_copy_byte_by_byte_on_the_stand_in() -> None:
    pool = np.arange(2 * 1 * 5 * 3, dtype=np.uint8).reshape(2, 1, 5, 3)  # 3-byte entries: no 16-byte vectors
    out = np.empty((1, 3, 3), np.uint8)
    gather_runs(np, pool, [(1, 1, 4)], out)
    assert np.array_equal(out, pool[1, :, 1:4])
    with pytest.raises(AssertionError):
        gather_runs(np, pool, [(1, 1, 5)], out)  # buffer of the wrong size
