"""Benchmark of the tiers' stores beside the plainest way to move the same bytes, in the same run.

    .venv/bin/python benchmarks/bench_tiers.py [--records N] [--record-kib K] [--runs R] [--dir PATH] [--json]

- host offload: `HostStore.put` of every record against `numpy.copyto` of the
  same bytes into a preallocated buffer; host reload: copying each record's
  view back into a device-like array against `numpy.copyto` of the same bytes;
- disk offload: `DiskStore.put_many` of every record as one batch (header,
  O_DIRECT where allowed, fsync per file, renames, one directory fsync)
  against a raw O_DIRECT write + fsync of the same bytes, one file per
  record; disk reload: `DiskStore.get` (read, header and payload checksums)
  against a raw read of the same files.  Payload checksums are computed when
  a record is built (not timed, as the executor computes them while copying
  out of device memory).

Figures: GB/s (median over the runs) and the ratio ours / baseline (the target
in issue 11: at least 0.7).  The page cache is not dropped between runs (no
root needed), so disk reads may come from memory for both sides alike.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hkv_core.layout import Layout  # noqa: E402
from hkv_core.tiers.record import RecordHeader, checksum  # noqa: E402
from hkv_exec_ref.tiers import DiskStore, HostStore  # noqa: E402

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
    store, flat = HostStore(total + 4096 * len(records)), np.empty(total, np.uint8)
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


def raw_write(path: Path, data: bytes) -> None:
    buffer = mmap.mmap(-1, -(-len(data) // 4096) * 4096)
    buffer[:len(data)] = data
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0)
    fd = os.open(path, flags, 0o644)
    try:
        os.write(fd, buffer)
        os.fsync(fd)
    finally:
        os.close(fd)
        buffer.close()


def disk_runs(records: list[np.ndarray], directory: Path) -> dict[str, float]:
    payloads = [r.tobytes() for r in records]
    headers = [header(p, i) for i, p in enumerate(payloads)]
    ours, raw = directory / "store", directory / "raw"
    raw.mkdir()
    store = DiskStore(ours, sum(len(p) + 8192 for p in payloads), FINGERPRINT)

    def offload() -> None:  # one batch, as a plan's store ops: one directory fsync
        store.put_many([(f"r{i}", h, p) for i, (h, p) in enumerate(zip(headers, payloads, strict=True))])

    def write_raw() -> None:
        for i, p in enumerate(payloads):
            raw_write(raw / f"r{i}", p)

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=64)
    parser.add_argument("--record-kib", type=int, default=1024, help="bytes per record (a page set), KiB")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the disk runs write (default: a temporary folder)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    records = [rng.integers(0, 256, args.record_kib * 1024, dtype=np.uint8) for _ in range(args.records)]
    total = sum(r.nbytes for r in records)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        disk = [disk_runs(records, Path(folder)) for _ in range(args.runs)]
    host = [host_runs(records) for _ in range(args.runs)]
    result = {"records": args.records, "record_bytes": args.record_kib * 1024, "runs": args.runs,
              "host": summary(host, total), "disk": {**summary(disk, total), "direct_io": bool(disk[0]["direct_io"])}}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.records} records x {args.record_kib} KiB, median of {args.runs} runs")
    for tier, base in (("host", "numpy.copyto"), ("disk", "raw O_DIRECT write / plain read")):
        r = result[tier]
        print(f"  {tier}: offload {r['offload_gbps']:.2f} GB/s vs {base} {r['offload_base_gbps']:.2f} GB/s "
              f"({r['offload_ratio']:.2f}x); reload {r['reload_gbps']:.2f} GB/s vs {r['reload_base_gbps']:.2f} "
              f"GB/s ({r['reload_ratio']:.2f}x)")
    print(f"  disk O_DIRECT: {result['disk']['direct_io']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
