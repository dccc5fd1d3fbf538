"""The CUDA executor's page movement beside plain copies of the same bytes, in one run (issue 13).

    .venv/bin/python benchmarks/bench_cuda.py [--backend cupy|numpy] [--pages N | --pool-mib M] [--runs R]
        [--reps K] [--json-out F]

Pools: every pool of DeepSeek V4-Flash (9 pools, 80 KB to 10 MB a page), `--pages`
pages each (256 by default), or as many pages as fit in `--pool-mib` MiB
(at least 3).  Half of each pool's real pages, shuffled, are the sources and
the other half the destinations; every figure moves those source pages of every
pool once (the same bytes for every row).  The pools hold random bytes.

**Device** (baseline: `dst[...] = src` of one contiguous device buffer per pool):
- page copy: one plan of `CopyPages` (every source page onto a destination page)
  through `CudaExecutor.run`;
- gather: `take(pool, idx, axis=0, out=buf)` (CuPy fancy indexing into a
  preallocated buffer) and the custom kernel `gather_runs` (page_gather.cu, one
  launch per pool); scatter: `pool[idx] = buf` and the kernel `scatter_runs`.

**Staging** (baseline: a plain copy of one contiguous device buffer into a
pinned host array, `buf.get(out=pinned)`, and back, `buf.set(pinned)`):
`export_rows` of the source pages into a pinned array (`ex.pinned.empty`) and
into an ordinary NumPy array (through the pinned staging buffer); `import_rows`
of the same rows onto the destination pages, from each.

Figures: GB/s of bytes moved (the median of `--runs` samples after a warm-up;
a device sample times `--reps` rounds between two `stream.synchronize()`), and
the ratio to its baseline; the issue's target is 0.7.  Before timing, the
kernel's gather and scatter are checked equal to CuPy's, and `export_rows`
equal to the gathered bytes (exit 1 if not).  `--backend numpy` runs the same
code on the CPU stand-in in a few seconds: a smoke run whose ratios compare
NumPy copies on the CPU, not GPU figures.  Timings are never asserted.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_manager import code_version  # noqa: E402  # this script's folder is on sys.path when it runs

from hkv_core.errors import MissingDependency, NoDevice  # noqa: E402
from hkv_core.executor import PoolBinding, Run, TrustingAuthority  # noqa: E402
from hkv_core.layout import Layout  # noqa: E402
from hkv_core.plan import CopyPages, Plan  # noqa: E402
from hkv_exec_cuda import CudaExecutor, cupy_backend, numpy_backend  # noqa: E402
from hkv_exec_cuda.kernels import ByteRuns, byte_runs, gather_runs, scatter_runs  # noqa: E402
from hkv_exec_ref.executor import NUMPY_DTYPES  # noqa: E402

PRESET = "deepseek_v4_flash"
TARGET_RATIO = 0.7
DEFAULT_PAGES = 256
MIN_PAGES = 3  # the NULL page, one source, one destination
NUMPY_POOL_MIB = 8  # the numpy smoke run's default pool size


@attrs.define
class PoolCase:
    """One pool's pages to move and the buffers every row uses."""

    name: str
    array: Any
    src: list[int]
    dst: list[int]
    src_idx: Any  # device index arrays
    dst_idx: Any
    src_runs: ByteRuns
    dst_runs: ByteRuns
    pages_buf: Any  # (n, layers, entries, *entry): take / pool[idx] = buf
    rows_buf: Any  # (layers, n * entries, *entry): the kernel's buffer, the staging rows
    copy_buf: Any  # baseline destination, like pages_buf
    pinned: Any  # host rows, pinned by the executor
    plain: Any  # host rows, ordinary NumPy memory

    def runs(self, pages: list[int]) -> list[Run]:
        return whole_pages(self.array, pages)


@attrs.define
class Bench:
    ex: CudaExecutor
    cases: list[PoolCase]
    copy_plan: Plan
    moved_bytes: int


# -------------------------------------------------------------------- set-up


def whole_pages(array: Any, pages: list[int]) -> list[Run]:
    """Runs (page, 0, entries_per_page): every entry of each page, for export_rows / import_rows / the kernel."""
    return [(p, 0, array.shape[2]) for p in pages]


def pages_per_pool(layout: Layout, pages: int, pool_mib: int | None) -> dict[str, int]:
    """Pages of each pool: `pages`, or as many as fit in `pool_mib` MiB (at least MIN_PAGES)."""
    out = {}
    for spec in layout.pools:
        itemsize = np.dtype(NUMPY_DTYPES[spec.dtype]).itemsize
        page_bytes = int(np.prod(PoolBinding(spec=spec, pages=2).shape[1:])) * itemsize
        out[spec.name] = max(MIN_PAGES, pages if pool_mib is None else (pool_mib << 20) // page_bytes)
    return out


def fill_random(ex: CudaExecutor, rng: np.random.Generator) -> None:
    """Distinct random bytes in every page (one random page per pool, xor'ed with the page number)."""
    xp = ex.xp
    with ex.stream:  # the executor's stream does not wait for CUDA's default stream
        for array in ex.pools.values():
            raw = array.view(xp.uint8).reshape(array.shape[0], -1)
            base = xp.asarray(rng.integers(0, 256, raw.shape[1], np.uint8))
            for page in range(raw.shape[0]):
                raw[page] = base ^ np.uint8(page % 256)
    ex.stream.synchronize()


def pool_case(ex: CudaExecutor, name: str, rng: np.random.Generator) -> PoolCase:
    xp, array = ex.xp, ex.pools[name]
    real = rng.permutation(np.arange(1, array.shape[0]))
    n = real.size // 2
    src, dst = real[:n].tolist(), real[n:2 * n].tolist()
    rows_shape, pages_shape = (array.shape[1], n * array.shape[2], *array.shape[3:]), (n, *array.shape[1:])
    with ex.stream:
        case = PoolCase(
            name=name, array=array, src=src, dst=dst, src_idx=xp.asarray(np.asarray(src, np.int64)),
            dst_idx=xp.asarray(np.asarray(dst, np.int64)), src_runs=byte_runs(xp, array, whole_pages(array, src)),
            dst_runs=byte_runs(xp, array, whole_pages(array, dst)), pages_buf=xp.empty(pages_shape, array.dtype),
            rows_buf=xp.empty(rows_shape, array.dtype), copy_buf=xp.empty(pages_shape, array.dtype),
            pinned=ex.pinned.empty(rows_shape, array.dtype), plain=np.zeros(rows_shape, array.dtype))
    ex.stream.synchronize()
    return case


def build(backend: Any, pages: dict[str, int]) -> Bench:
    layout = Layout.from_preset(PRESET)
    ex = CudaExecutor(backend)
    ex.bind([PoolBinding(spec=s, pages=pages[s.name]) for s in layout.pools], TrustingAuthority())
    if ex.xp is not np:
        ex.xp.cuda.Device().synchronize()  # bind zeroes the pools on the default stream, which ex.stream ignores
    rng = np.random.default_rng(13)
    fill_random(ex, rng)
    cases = [pool_case(ex, spec.name, rng) for spec in layout.pools]
    ops = [CopyPages(pool=c.name, src=s, dst=d, entries=c.array.shape[2], src_version=0)
           for c in cases for s, d in zip(c.src, c.dst, strict=True)]
    moved = sum(int(c.pages_buf.nbytes) for c in cases)
    return Bench(ex=ex, cases=cases, copy_plan=Plan(ops=ops, label="bench_cuda"), moved_bytes=moved)


# -------------------------------------------------------------------- what is timed


@attrs.frozen
class Row:
    """One figure: `step` moves every source page of every pool once; `baseline` names the row it is compared to
    (None: this row is a baseline)."""

    section: str
    name: str
    baseline: str | None
    step: Callable[[], None]


def take_into(xp: Any, array: Any, idx: Any, out: Any) -> None:
    """`out[...] = array[idx]` with no temporary (NumPy buffers `out` unless mode="clip"; CuPy has no mode)."""
    if xp is np:
        np.take(array, idx, axis=0, out=out, mode="clip")
    else:
        xp.take(array, idx, axis=0, out=out)


def every_pool(bench: Bench, step: Callable[[PoolCase], None]) -> Callable[[], None]:
    """One round of `step` over every pool, queued on the executor's stream."""

    def round_() -> None:
        with bench.ex.stream:
            for case in bench.cases:
                step(case)

    return round_


def device_rows(bench: Bench) -> list[Row]:
    xp, ex, base = bench.ex.xp, bench.ex, "copy d2d"

    def copy(c: PoolCase) -> None:
        xp.copyto(c.copy_buf, c.pages_buf)  # CuPy: one cudaMemcpyAsync (both contiguous, one dtype)

    def run_copy_plan() -> None:
        ex.run(bench.copy_plan)

    def take(c: PoolCase) -> None:
        take_into(xp, c.array, c.src_idx, c.pages_buf)

    def gather_kernel(c: PoolCase) -> None:
        gather_runs(xp, c.array, c.src_runs, c.rows_buf)

    def put(c: PoolCase) -> None:
        c.array[c.dst_idx] = c.pages_buf

    def scatter_kernel(c: PoolCase) -> None:
        scatter_runs(xp, c.array, c.dst_runs, c.rows_buf)

    return [Row("device", base, None, every_pool(bench, copy)),
            Row("device", "page copy: run(CopyPages)", base, run_copy_plan),
            Row("device", "gather: take(out=)", base, every_pool(bench, take)),
            Row("device", "gather: kernel", base, every_pool(bench, gather_kernel)),
            Row("device", "scatter: pool[idx] = buf", base, every_pool(bench, put)),
            Row("device", "scatter: kernel", base, every_pool(bench, scatter_kernel))]


def staging_rows(bench: Bench) -> list[Row]:
    ex, out, back = bench.ex, "D2H pinned copy", "H2D pinned copy"

    def d2h(c: PoolCase) -> None:
        ex.backend.to_host(c.rows_buf, c.pinned, ex.stream)
        ex.stream.synchronize()

    def h2d(c: PoolCase) -> None:
        ex.backend.to_device(c.pinned, c.rows_buf, ex.stream)
        ex.stream.synchronize()

    return [Row("staging", out, None, every_pool(bench, d2h)),
            Row("staging", "export_rows -> pinned", out,
                every_pool(bench, lambda c: ex.export_rows(c.name, c.runs(c.src), c.pinned))),
            Row("staging", "export_rows -> numpy", out,
                every_pool(bench, lambda c: ex.export_rows(c.name, c.runs(c.src), c.plain))),
            Row("staging", back, None, every_pool(bench, h2d)),
            Row("staging", "import_rows <- pinned", back,
                every_pool(bench, lambda c: ex.import_rows(c.name, c.runs(c.dst), c.pinned))),
            Row("staging", "import_rows <- numpy", back,
                every_pool(bench, lambda c: ex.import_rows(c.name, c.runs(c.dst), c.plain)))]


def median_s(step: Callable[[], None], sync: Callable[[], None], runs: int, reps: int) -> float:
    """Median seconds of one `step` over `runs` samples of `reps` steps each, after one warm-up step."""
    step()
    sync()
    samples = []
    for _ in range(runs):
        sync()
        start = time.perf_counter()
        for _ in range(reps):
            step()
        sync()
        samples.append((time.perf_counter() - start) / reps)
    return statistics.median(samples)


# -------------------------------------------------------------------- checks (not timed)


def to_host(array: Any) -> Any:
    return array.get() if hasattr(array, "get") else array  # a CuPy array's host copy, or the NumPy array


def check(bench: Bench) -> list[str]:
    """The kernel's gather equals take's, export_rows equals the gathered rows, the kernel's scatter lands the
    source pages on the destinations; what differs."""
    ex, xp, problems = bench.ex, bench.ex.xp, []
    with ex.stream:
        for c in bench.cases:
            take_into(xp, c.array, c.src_idx, c.pages_buf)
            gather_runs(xp, c.array, c.src_runs, c.rows_buf)
            layers, n = c.array.shape[1], len(c.src)
            rows = c.rows_buf.view(xp.uint8).reshape(layers, n, -1)
            pages = c.pages_buf.view(xp.uint8).reshape(n, layers, -1).swapaxes(0, 1)
            if not bool(xp.array_equal(rows, pages)):
                problems.append(f"{c.name}: the kernel's gather differs from take")
            ex.export_rows(c.name, c.runs(c.src), c.pinned)
            if not np.array_equal(c.pinned.view(np.uint8), to_host(c.rows_buf).view(np.uint8)):
                problems.append(f"{c.name}: export_rows differs from the gathered rows")
            scatter_runs(xp, c.array, c.dst_runs, c.rows_buf)
            if not bool(xp.array_equal(c.array[c.dst_idx].view(xp.uint8), c.array[c.src_idx].view(xp.uint8))):
                problems.append(f"{c.name}: the kernel's scatter did not land the source pages")
    ex.stream.synchronize()
    return problems


# -------------------------------------------------------------------- report


def measure(bench: Bench, runs: int, reps: int) -> list[dict[str, object]]:
    """Every row's GB/s (device rows: `reps` steps a sample; staging rows, each of which waits: one), in order."""
    gbps: dict[str, float] = {}
    figures = []
    for row in device_rows(bench) + staging_rows(bench):
        seconds = median_s(row.step, bench.ex.stream.synchronize, runs, reps if row.section == "device" else 1)
        gbps[row.name] = bench.moved_bytes / seconds / 1e9
        figures.append(figure(row, gbps))
    return figures


def figure(row: Row, gbps: dict[str, float]) -> dict[str, object]:
    base_gbps = gbps[row.baseline or row.name]
    ratio = gbps[row.name] / base_gbps
    target = None if row.baseline is None else TARGET_RATIO
    return {"section": row.section, "name": row.name, "gbps": gbps[row.name], "baseline": row.baseline,
            "baseline_gbps": base_gbps, "ratio": ratio, "target_ratio": target,
            "met": None if target is None else ratio >= target}


def table(result: dict[str, Any]) -> Table:
    out = Table(title=f"bench_cuda ({result['backend']}): {result['moved_bytes'] / 1e9:.3f} GB per figure, median "
                      f"of {result['runs']} runs", caption=result["note"])
    for column in ("section", "operation", "GB/s", "baseline", "ratio", f"target {TARGET_RATIO}"):
        out.add_column(column, justify="right" if column in ("GB/s", "ratio") else "left")
    for f in result["rows"]:
        met = "baseline" if f["met"] is None else ("yes" if f["met"] else "NO")
        out.add_row(f["section"], escape(f["name"]), f"{f['gbps']:.2f}", f["baseline"] or "-", f"{f['ratio']:.2f}",
                    met)
    return out


def device_name(backend: Any) -> str:
    if backend.name == "numpy":
        return f"CPU ({platform.machine()}, NumPy stand-in)"
    cuda = backend.xp.cuda
    name = cuda.runtime.getDeviceProperties(cuda.Device().id)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    return f"{name} (CuPy {backend.xp.__version__}, CUDA runtime {cuda.runtime.runtimeGetVersion()})"


NOTES = {"cupy": "GB/s of bytes moved; ratio: ours / the baseline of its section",
         "numpy": "numpy backend: a CPU smoke run; ratios compare NumPy copies on the CPU (memcpy), not GPU figures"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("cupy", "numpy"), default="cupy")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--pages", type=int, default=None, help=f"pages per pool (default {DEFAULT_PAGES})")
    size.add_argument("--pool-mib", type=int, default=None, help=f"pages per pool to fill this many MiB (default "
                                                                  f"{NUMPY_POOL_MIB} with --backend numpy)")
    parser.add_argument("--runs", type=int, default=7, help="samples per figure, median reported")
    parser.add_argument("--reps", type=int, default=5, help="device figures: steps per sample")
    parser.add_argument("--json-out", default=None, help="also write the figures as JSON to this file")
    args = parser.parse_args(argv)
    try:
        backend = cupy_backend() if args.backend == "cupy" else numpy_backend()
    except (MissingDependency, NoDevice) as err:
        print(f"bench_cuda: {err}; --backend numpy runs the CPU stand-in", file=sys.stderr)
        return 2
    smoke = args.backend == "numpy" and args.pages is None and args.pool_mib is None
    pool_mib = NUMPY_POOL_MIB if smoke else args.pool_mib
    pages = pages_per_pool(Layout.from_preset(PRESET), args.pages or DEFAULT_PAGES, pool_mib)
    bench = build(backend, pages)
    problems = check(bench)
    result = {"commit": code_version("hkv_core", "hkv_exec_cuda"), "backend": backend.name,
              "device": device_name(backend),
              "python": sys.version.split()[0], "numpy": np.__version__, "layout": PRESET, "pages": pages,
              "moved_bytes": bench.moved_bytes, "runs": args.runs, "reps": args.reps, "checked": not problems,
              "problems": problems, "note": NOTES[backend.name], "rows": measure(bench, args.runs, args.reps)}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1) + "\n")
    console = Console(width=max(Console().width, 100))
    console.print(f"code {result['commit']}; {result['device']}; pages per pool: "
                  + ", ".join(f"{name} {n}" for name, n in pages.items()))
    console.print(table(result))
    for problem in problems:
        console.print(f"CHECK FAILED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
