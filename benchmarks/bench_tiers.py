"""Benchmark of the tiers beside the plainest way to move the same bytes, in the same run.

    .venv/bin/python benchmarks/bench_tiers.py [--records N] [--record-kib K] [--runs R] [--dir PATH]
        [--blocks B] [--record-runs R] [--only store|record] [--json] [--json-out F]

Two sections.  **Stores**: the stores alone, on records of `--record-kib` KiB.

- host offload: `HostArena.put` of every record against `numpy.copyto` of the
  same bytes into a preallocated buffer; host reload: copying each record's
  view back into a device-like array against `numpy.copyto` of the same bytes;
- disk offload: `DiskStore.put_many` of every record as one batch (header,
  O_DIRECT where allowed, fsync per file, renames, one directory fsync)
  against a raw O_DIRECT write + fsync of the same bytes, one file per
  record, from page-aligned buffers filled before the clock starts; disk
  reload: `DiskStore.get` (read, header and payload checksums) against a raw
  read of the same files.  Payload checksums are computed when
  a record is built (not timed, as the executor computes them while copying
  out of device memory).

**Record path**: what the engine moves, on DeepSeek V4-Flash (block 256): one
request of `--blocks` blocks (+ 1 token) allocated through a CacheManager, its
pages filled with random bytes in a RefExecutor, and its `--blocks` block
records and the point record at its end (as tests/tiers/test_record_round_trip.py):

- host offload: `TierCache.store` of every record filled by a store plan the
  manager issued (the engine's `TierLink.store`: each page run copied from the
  pools straight into the host arena, then checksum and header) against
  `numpy.copyto` of the same payload bytes out of the pool arrays into a
  preallocated host buffer;
- host reload: `TierCache.fetch` from the host (header and payload checked, a
  view of the arena) + one load plan into a second request's allocation,
  settled by `complete` (as the engine's `TierLink.load`) against one `numpy.copyto` of the same bytes back into a
  preallocated array;
- disk offload: the host offload and then `TierCache.evict("host")` (one
  durable batch on the writer thread, drained), end to end, against a raw
  O_DIRECT write + fsync of the same payload bytes, one file per record, from
  page-aligned buffers filled before the clock starts; `demote_gbps`: the
  eviction alone.  Disk reload: `TierCache.fetch`
  from disk (loader threads, checked) + the load plan against a plain read
  of the raw files, one after another.
- the first run checks that the second allocation reads back bit-exact after
  each reload (not timed); `phases_ms` splits the record path into its steps
  (medians over the runs).

Figures: GB/s of payload bytes (median over the runs) and the ratio ours /
baseline (the target in issue 11: at least 0.7).  The page cache is not
dropped between runs (no root needed), so disk reads may come from memory for
both sides alike.  `--json-out benchmarks/results/bench_tiers.json` stores a
run with its commit.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_manager import code_version  # noqa: E402  # this script's folder is on sys.path when it runs

from hkv_core.layout import EntryKind, Layout  # noqa: E402
from hkv_core.manager import Allocation, CacheManager, ManagerConfig  # noqa: E402
from hkv_core.tiers.record import RecordHeader, checksum  # noqa: E402
from hkv_exec_ref.executor import NUMPY_DTYPES, RefExecutor  # noqa: E402
from hkv_tiers import DiskStore, HostArena, TierCache, span_io  # noqa: E402
from hkv_tiers.tier_cache import Wanted  # noqa: E402

FINGERPRINT = Layout.from_preset("deepseek_v4_flash").fingerprint()


def timed(run: Callable[[], None]) -> float:
    began = time.perf_counter()
    run()
    return time.perf_counter() - began


def header(payload: bytes, i: int) -> RecordHeader:
    return RecordHeader(layout_fingerprint=FINGERPRINT, kind="compressed_kv", abi_id="bench", token_start=i * 256,
                        token_end=(i + 1) * 256, keys=np.zeros((16, 2), np.uint64), payload_bytes=len(payload),
                        payload_checksum=checksum(payload))


def host_runs(records: list[np.ndarray]) -> dict[str, float]:
    total = sum(r.nbytes for r in records)
    store, flat = HostArena(total + 4096 * len(records)), np.empty(total, np.uint8)
    device = [np.empty_like(r) for r in records]
    for buffer in (flat, *device):  # every buffer resident before timing: no side pays the first-touch faults
        buffer.fill(0)

    def offload() -> None:
        for i, r in enumerate(records):
            store.put(f"r{i}", r)

    def copy_in() -> None:
        at = 0
        for r in records:
            np.copyto(flat[at:at + r.size], r)
            at += r.size

    def reload() -> None:
        for i, d in enumerate(device):
            np.copyto(d, store.view(f"r{i}"))

    def copy_out() -> None:
        at = 0
        for d in device:
            np.copyto(d, flat[at:at + d.size])
            at += d.size

    return {"offload": timed(offload), "offload_base": timed(copy_in), "reload": timed(reload),
            "reload_base": timed(copy_out)}


def aligned_copy(data: bytes) -> mmap.mmap:
    """`data` in a page-aligned buffer padded to 4,096 (what O_DIRECT writes from)."""
    buffer = mmap.mmap(-1, -(-len(data) // 4096) * 4096)
    buffer[:len(data)] = data
    return buffer


def raw_write(path: Path, buffer: mmap.mmap) -> None:
    """A raw O_DIRECT write + fsync of a prepared aligned buffer, one file."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0)
    fd = os.open(path, flags, 0o644)
    try:
        os.write(fd, buffer)
        os.fsync(fd)
    finally:
        os.close(fd)


def disk_runs(records: list[np.ndarray], directory: Path) -> dict[str, float]:
    payloads = [r.tobytes() for r in records]
    headers = [header(p, i) for i, p in enumerate(payloads)]
    ours, raw = directory / "store", directory / "raw"
    raw.mkdir()
    store = DiskStore(ours, sum(len(p) + 8192 for p in payloads), FINGERPRINT)

    def offload() -> None:  # one batch, as a plan's store ops: one directory fsync
        store.put_many([(f"r{i}", h, p) for i, (h, p) in enumerate(zip(headers, payloads, strict=True))])

    aligned = [aligned_copy(p) for p in payloads]  # filled before the clock starts, as the record section's

    def write_raw() -> None:
        for i, buffer in enumerate(aligned):
            raw_write(raw / f"r{i}", buffer)

    def reload() -> None:
        for i in range(len(payloads)):
            store.get(f"r{i}")

    def read_raw() -> None:
        for i in range(len(payloads)):
            (raw / f"r{i}").read_bytes()

    out = {"offload": timed(offload), "offload_base": timed(write_raw), "reload": timed(reload),
           "reload_base": timed(read_raw), "direct_io": float(store.direct_io)}
    for path in [*ours.iterdir(), *raw.iterdir()]:
        path.unlink()
    ours.rmdir()
    raw.rmdir()
    return out


def summary(runs: list[dict[str, float]], total: int) -> dict[str, float]:
    out = {}
    for name in ("offload", "reload"):
        ours = statistics.median(r[name] for r in runs)
        base = statistics.median(r[f"{name}_base"] for r in runs)
        out[f"{name}_gbps"] = round(total / ours / 1e9, 3)
        out[f"{name}_base_gbps"] = round(total / base / 1e9, 3)
        out[f"{name}_ratio"] = round(base / ours, 3)
    return out


# ---------------------------------------------------------------- record path (V4-Flash)


RECORD_LAYOUT = "deepseek_v4_flash"


class RecordBench:
    """A CacheManager and a RefExecutor on V4-Flash with two requests of `blocks` blocks (+ 1 token) in flight:
    the source (pages filled with random bytes, its records read from there) and the target (loads are written
    into its allocation, as `TierLink.load` writes into the request's new slots)."""

    def __init__(self, blocks: int, seed: int = 1) -> None:
        self.layout = Layout.from_preset(RECORD_LAYOUT)
        self.block, self.blocks = self.layout.block_tokens, blocks
        self.end = blocks * self.block
        # one allocation takes a window page per block before its commit slides the window: two requests in flight
        self.manager = CacheManager(self.layout, ManagerConfig(default_pool_pages=2 * blocks + 4, key_seed=1))
        self.executor = RefExecutor()
        self.executor.bind(self.manager.bindings(), self.manager)
        self.pools = tuple(b.spec for b in self.manager.bindings())
        for array in self.executor.pools.values():  # every page resident: the baselines read real memory too
            array.reshape(-1).view(np.uint8).fill(1)
        self.source, self.keys, self.source_rid = self._allocate(0)
        self.target, _, self.target_rid = self._allocate(1)
        self._fill(self.source, seed)
        b = self.block
        lo_point = span_io.token_range(self.layout, span_io.POINT, self.end - b, self.end)[0]
        # (kind, lo the header names, hi, lo span_io reads and writes from, block key)
        self.records = [(span_io.BLOCK, hi - b, hi, hi - b, self.keys[hi // b - 1]) for hi in range(b, self.end + 1, b)]
        self.records.append((span_io.POINT, lo_point, self.end, lo_point, self.keys[blocks - 1]))
        self.expected = {(kind, hi): self.read(kind, lo, hi) for kind, _, hi, lo, _ in self.records}
        self.sizes = [[a.nbytes for a in self.expected[(kind, hi)].values()] for kind, _, hi, _, _ in self.records]
        self.total = sum(map(sum, self.sizes))
        self.wanted = [Wanted(kind, key, lo, hi) for kind, lo, hi, _, key in self.records]
        self.aligned = []  # each record's payload in a page-aligned buffer (the raw O_DIRECT baseline's source)
        for kind, _, hi, _, _ in self.records:
            payload = span_io.encode(self.pools, kind, self.expected[(kind, hi)])
            buffer = mmap.mmap(-1, -(-len(payload) // 4096) * 4096)
            buffer[:len(payload)] = payload
            self.aligned.append(buffer)

    def _allocate(self, offset: int) -> tuple[Allocation, np.ndarray, int]:
        prompt = (np.arange(self.end + 1) + offset) % 1000
        rid = self.manager.add_request(prompt)
        self.manager.acquire(rid, self.manager.match(rid))
        alloc = self.manager.allocate(rid, self.end)
        return alloc, self.manager.block_keys(rid), rid

    def _fill(self, alloc: Allocation, seed: int) -> None:
        """Random bytes in every slot the allocation writes and in its tail pages (as the round-trip test)."""
        rng = np.random.default_rng(seed)
        for binding in self.manager.bindings():
            spec = binding.spec
            if spec.entry_kind is EntryKind.TAIL_ROW:
                slots = alloc.tail_pages[spec.name] * spec.entries_per_page + np.arange(spec.entries_per_page)
            else:
                slots = alloc.slots[spec.name]
            values = rng.integers(0, 2**15, (len(slots), spec.layer_count, *spec.entry_shape))
            self.executor.write(spec.name, slots, values.astype(NUMPY_DTYPES[spec.dtype]))

    def scramble_target(self) -> None:
        """Other bytes in the target's slots: a reload must write every byte again to read back equal."""
        self._fill(self.target, seed=7919)

    def read(self, kind: str, lo: int, hi: int, alloc: Allocation | None = None) -> span_io.Arrays:
        rid = self.target_rid if alloc is self.target else self.source_rid
        return span_io.read(self.manager, self.executor, rid, self.layout, self.pools, kind, alloc or self.source,
                            lo, hi)

    def cache(self, directory: Path) -> TierCache:
        """A TierCache whose host arena holds every record twice over (the writer stays idle until evict)."""
        nbytes = 2 * (self.total + 8192 * len(self.records))
        return TierCache(pools=self.pools, layout_fingerprint=self.layout.fingerprint(), model_id=RECORD_LAYOUT,
                         key_seed=1, host_bytes=nbytes, directory=directory, disk_bytes=nbytes)


def record_runs(bench: RecordBench, directory: Path, check: bool) -> dict[str, float]:
    """One run of every side of the record-path section; seconds per side and per phase."""
    layout, pools, ex = bench.layout, bench.pools, bench.executor
    phase = dict.fromkeys(("store", "fetch_host", "fetch_disk", "load_host", "load_disk"), 0.0)
    flat = np.empty(bench.total, np.uint8)
    back = np.empty(bench.total, np.uint8)
    for buffer in (flat, back):
        buffer.fill(0)
    sources = {name: array.reshape(-1).view(np.uint8) for name, array in ex.pools.items()}
    cache = bench.cache(directory / "cache")
    raw = directory / "raw"
    raw.mkdir()

    def offload() -> None:  # TierLink.store, every record: a store plan from the pools straight into the arena
        for kind, lo, hi, read_lo, key in bench.records:
            t0 = time.perf_counter()
            nbytes = span_io.payload_bytes(layout, pools, kind, read_lo, hi)
            rows = span_io.store_rows(layout, pools, kind, bench.source, read_lo, hi, "r")
            cache.store(kind, key, lo, hi, nbytes, lambda out, rows=rows: span_io.run_store(
                bench.manager, ex, bench.source_rid, rows, {"r": out}))
            phase["store"] += time.perf_counter() - t0

    def copy_in() -> None:  # the same bytes per pool out of that pool's pages (past the NULL page), back to back
        at, offsets = 0, {}
        for (kind, *_), sizes in zip(bench.records, bench.sizes, strict=True):
            for spec, n in zip(span_io.pools_of(pools, kind), sizes, strict=True):
                src = sources[spec.name]
                start = offsets.get(spec.name, src.size // ex.pools[spec.name].shape[0])
                start = start if start + n <= src.size else src.size // ex.pools[spec.name].shape[0]
                np.copyto(flat[at:at + n], src[start:start + n])
                offsets[spec.name], at = start + n, at + n

    def reload(tier: str) -> None:  # TierLink.load, every record
        t0 = time.perf_counter()
        got = cache.fetch(bench.wanted)
        t1 = time.perf_counter()
        rows, buffers = [], {}
        for i, ((kind, _, hi, read_lo, _), found) in enumerate(zip(bench.records, got, strict=True)):
            assert found is not None and found[0] == tier, (tier, kind, hi, found and found[0])
            rows += span_io.load_rows(layout, pools, kind, bench.target, read_lo, hi, f"r{i}", last=hi == bench.end)
            buffers[f"r{i}"] = span_io.buffer_of(found[1])
        done = span_io.run_load(bench.manager, ex, bench.target_rid, rows, buffers)  # one plan, as TierLink.load
        assert done.ok
        t2 = time.perf_counter()
        phase[f"fetch_{tier}"] += t1 - t0
        phase[f"load_{tier}"] += t2 - t1

    def verify(tier: str) -> None:  # not timed: the target reads back what the source held, bit-exact
        for kind, _, hi, read_lo, _ in bench.records:
            got, want = bench.read(kind, read_lo, hi, bench.target), bench.expected[(kind, hi)]
            assert all(np.array_equal(got[k], want[k]) for k in want), (tier, kind, hi)
        bench.scramble_target()  # the next reload must write every byte again to pass

    def copy_out() -> None:  # the same pieces back, into a preallocated destination
        at = 0
        for sizes in bench.sizes:
            for n in sizes:
                np.copyto(back[at:at + n], flat[at:at + n])
                at += n

    def demote() -> None:
        assert cache.evict("host") == len(bench.records)

    def write_raw() -> None:  # the bytes already sit in aligned buffers: only open, write, fsync, close are timed
        for i, buffer in enumerate(bench.aligned):
            fd = os.open(raw / f"r{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o644)
            try:
                os.write(fd, buffer)
                os.fsync(fd)
            finally:
                os.close(fd)

    def read_raw() -> None:
        for i in range(len(bench.aligned)):
            (raw / f"r{i}").read_bytes()

    try:
        out = {"host_offload": timed(offload), "host_offload_base": timed(copy_in),
               "host_reload": timed(lambda: reload("host")), "host_reload_base": timed(copy_out)}
        if check:
            verify("host")
        out["demote"] = timed(demote)
        out["disk_offload_base"] = timed(write_raw)
        out["disk_reload"] = timed(lambda: reload("disk"))
        out["disk_reload_base"] = timed(read_raw)
        if check:
            verify("disk")
        out["disk_offload"] = out["host_offload"] + out["demote"]
        out["direct_io"] = float(bool(cache.disk and cache.disk.direct_io))
    finally:
        cache.close()
    out.update({f"phase_{k}": v for k, v in phase.items()})
    shutil.rmtree(directory / "cache")
    shutil.rmtree(raw)
    return out


def record_summary(runs: list[dict[str, float]], total: int) -> dict[str, dict[str, float]]:
    out = {}
    for tier in ("host", "disk"):
        out[tier] = summary([{k[len(tier) + 1:]: v for k, v in r.items() if k.startswith(tier + "_")} for r in runs],
                            total)
    demote = statistics.median(r["demote"] for r in runs)
    out["disk"]["demote_gbps"] = round(total / demote / 1e9, 3)
    out["disk"]["demote_ratio"] = round(statistics.median(r["disk_offload_base"] for r in runs) / demote, 3)
    out["disk"]["direct_io"] = bool(runs[0]["direct_io"])
    out["phases_ms"] = {k[len("phase_"):]: round(statistics.median(r[k] for r in runs) * 1e3, 2)
                        for k in runs[0] if k.startswith("phase_")}
    out["phases_ms"]["demote"] = round(demote * 1e3, 2)
    return out


def print_tier(tier: str, base: str, r: dict[str, float]) -> None:
    print(f"  {tier}: offload {r['offload_gbps']:.2f} GB/s vs {base} {r['offload_base_gbps']:.2f} GB/s "
          f"({r['offload_ratio']:.2f}x); reload {r['reload_gbps']:.2f} GB/s vs {r['reload_base_gbps']:.2f} "
          f"GB/s ({r['reload_ratio']:.2f}x)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=64, help="stores section: records")
    parser.add_argument("--record-kib", type=int, default=1024, help="stores section: bytes per record, KiB")
    parser.add_argument("--runs", type=int, default=5, help="stores section: runs")
    parser.add_argument("--blocks", type=int, default=24, help="record-path section: blocks of 256 tokens")
    parser.add_argument("--record-runs", type=int, default=7, help="record-path section: runs")
    parser.add_argument("--only", choices=("store", "record"), default=None, help="one section only")
    parser.add_argument("--dir", default=None, help="where the disk runs write (default: a temporary folder)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--json-out", default=None, help="also write the JSON object to this file")
    args = parser.parse_args(argv)
    result: dict[str, object] = {"commit": code_version("hkv_core", "hkv_exec_ref"), "python": sys.version.split()[0],
                                 "numpy": np.__version__}
    if args.only != "record":
        rng = np.random.default_rng(0)
        records = [rng.integers(0, 256, args.record_kib * 1024, dtype=np.uint8) for _ in range(args.records)]
        total = sum(r.nbytes for r in records)
        with tempfile.TemporaryDirectory(dir=args.dir) as folder:
            disk = [disk_runs(records, Path(folder)) for _ in range(args.runs)]
        host = [host_runs(records) for _ in range(args.runs)]
        result.update({"records": args.records, "record_bytes": args.record_kib * 1024, "runs": args.runs,
                       "host": summary(host, total),
                       "disk": {**summary(disk, total), "direct_io": bool(disk[0]["direct_io"])}})
    if args.only != "store":
        bench = RecordBench(args.blocks)
        runs = []
        with tempfile.TemporaryDirectory(dir=args.dir) as folder:
            for i in range(args.record_runs):
                runs.append(record_runs(bench, Path(folder), check=i == 0))
        point = bench.sizes[-1]
        result["record_path"] = {"layout": RECORD_LAYOUT, "block_tokens": bench.block, "blocks": args.blocks,
                                 "records": len(bench.records), "block_record_bytes": sum(bench.sizes[0]),
                                 "point_record_bytes": sum(point), "payload_bytes": bench.total,
                                 "runs": args.record_runs, **record_summary(runs, bench.total)}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    bases = (("host", "numpy.copyto"), ("disk", "raw O_DIRECT write / plain read"))
    print(f"code {result['commit']}")
    if "host" in result:
        print(f"stores: {args.records} records x {args.record_kib} KiB, median of {args.runs} runs")
        for tier, base in bases:
            print_tier(tier, base, result[tier])  # type: ignore[arg-type]
        print(f"  disk O_DIRECT: {result['disk']['direct_io']}")  # type: ignore[index]
    if "record_path" in result:
        r = result["record_path"]
        print(f"record path ({RECORD_LAYOUT}, block {r['block_tokens']}): {r['blocks']} block records of "  # type: ignore[index]
              f"{r['block_record_bytes'] / 1e6:.2f} MB + a point record of {r['point_record_bytes'] / 1e6:.2f} MB, "  # type: ignore[index]
              f"median of {r['runs']} runs")  # type: ignore[index]
        for tier, base in bases:
            print_tier(tier, base, r[tier])  # type: ignore[index]
        d = r["disk"]  # type: ignore[index]
        print(f"  disk eviction alone (host -> disk, drained): {d['demote_gbps']:.2f} GB/s ({d['demote_ratio']:.2f}x); "
              f"O_DIRECT: {d['direct_io']}")
        print("  phases (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in r["phases_ms"].items()))  # type: ignore[index]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
