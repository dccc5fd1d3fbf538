"""Benchmark of the remote tier (a Mooncake Store) beside raw Mooncake put/get of the same bytes, in the same run.

    .venv/bin/python benchmarks/bench_remote.py [--payload-kib K [K ...]] [--records N] [--runs R] [--warmup W]
        [--quick] [--json] [--json-out F]

A local `mooncake_master` is started on loopback ports (`MooncakeMaster`); hkv's side is a `RemoteStore`
(`hkv_tiers/remote_store.py`), once with `RemoteTierConfig(zero_copy=True)` (its staging arena
registered with the client: `put_from` / `batch_get_into`) and once with `zero_copy=False` (plain `put` /
`get`).  Each mode has its own client, set up by `connect(config)`; the baselines run on that same client
(`store.client`), so both sides put into and get from the same segment through the same transfer engine.
Only one client is up at a time: every object lands in its segment (with TCP alone Mooncake moves local
bytes by memcpy, so the figures are the client's own costs, not a network's).

Per payload size (`--payload-kib`, default 64, 256 and 1,024 KiB) and run, `--records` records (default 64)
of random bytes, each with a block record's header (4,096 bytes: layout fingerprint, kind, ABI id, token
range, block key, payload checksum):

- publish: `RemoteStore.publish` of every record (header built with the UNSUMMED checksum, as the engine
  hands records over: the worker computes the XXH3 checksum, packs the header and puts the record) and
  `drain()`, against a raw `client.put(key, image)` of the same images (header with its checksum + payload,
  prepared as `bytes` before the clock starts), one after another on the caller's thread;
- fetch: `RemoteStore.fetch` of every record (one `batch_get_into` into staging slots, or one `get` each
  with zero_copy=False; then every record checked: header, layout, kind, ABI id, token range, key, length,
  XXH3 checksum; payloads returned as views) against a raw `client.get(key)` of the raw keys one after
  another (the headline baseline), and against one raw `client.batch_get_into` of those keys into a
  buffer registered with the client and touched before the clock starts (the second baseline: the
  fastest plain read the client offers).

hkv's side and the raw put / get alternate which goes first from run to run (a segment's first touch, or a
warm cache, falls on each alike; the batch_get_into baseline comes last); `--warmup` runs (default 1) come
first and are not counted.  Every run uses new keys (a
Mooncake put of a key the store holds is a no-op) and removes its objects after it (not timed).  The first
counted run checks, not timed, that each fetched payload equals the one published and that the raw gets
returned the images put.

Figures: GB/s of payload bytes (the 4,096-byte headers move on both sides but are not counted), the median
over the runs, and the ratio hkv / baseline (issue: "hkv's remote-tier throughput beside raw Mooncake
put/get of the same bytes in the same run (target: at least 70 %)"), with a pass / fail column against 0.7.
The client's log level is set to ERROR in-process (`MC_LOG_LEVEL`, read when a client is set up;
`GLOG_minloglevel` does not quiet it): one "metadata not found" line per client set-up is Mooncake's own
first lookup of its segment.  `--json-out benchmarks/results/bench_remote.json` stores a run with its commit.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_manager import code_version  # noqa: E402  # this script's folder is on sys.path when it runs

from hkv_core.layout import Layout  # noqa: E402
from hkv_core.tiers.record import HEADER_BYTES, UNSUMMED, RecordHeader, checksum, pack_header  # noqa: E402
from hkv_tiers.mooncake_master import MooncakeMaster  # noqa: E402
from hkv_tiers.record_check import Wanted, record_name  # noqa: E402
from hkv_tiers.remote_store import RemoteStore  # noqa: E402
from hkv_tiers.span_io import BLOCK  # noqa: E402

FINGERPRINT = Layout.from_preset("deepseek_v4_flash").fingerprint()
ABI_ID = "bench"
KIND = BLOCK
TARGET = 0.7
MODES = {"zero_copy": True, "plain": False}  # section name -> RemoteTierConfig.zero_copy
CONFIG: dict[str, Any] = {"segment_bytes": 512 << 20, "staging_bytes": 256 << 20, "buffer_bytes": 256 << 20,
                          "deadline_s": 60.0}  # a deadline far past any batch here: the run measures speed, not misses


def config_for(run_bytes: int) -> dict[str, Any]:
    """CONFIG, grown when a run's images (`run_bytes`, one side's) would not fit: staging holds a run's twice, the
    segment both sides' objects with room below Mooncake's eviction watermark."""
    return {**CONFIG, "staging_bytes": max(CONFIG["staging_bytes"], 2 * run_bytes),
            "segment_bytes": max(CONFIG["segment_bytes"], 4 * run_bytes)}
DEFAULTS: dict[str, Any] = {"payload_kib": [64, 256, 1024], "records": 64, "runs": 5, "warmup": 1}
QUICK: dict[str, Any] = {"payload_kib": [64], "records": 8, "runs": 1, "warmup": 0}


def timed(run: Callable[[], None]) -> float:
    began = time.perf_counter()
    run()
    return time.perf_counter() - began


class Records:
    """`count` records of `payload_bytes` random bytes: the payloads, their keys and headers (unsummed, as hkv
    publishes them) and each one's image (header with its checksum + payload, as `bytes`: the raw side's)."""

    def __init__(self, count: int, payload_bytes: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.payload_bytes = payload_bytes
        self.payloads = [rng.integers(0, 256, payload_bytes, dtype=np.uint8) for _ in range(count)]
        self.images = [pack_header(self.header(i, 0, checksum(p))) + p.tobytes() for i, p in enumerate(self.payloads)]

    def key(self, i: int, tag: int) -> np.ndarray:
        return np.array([tag, i], np.uint64)

    def header(self, i: int, tag: int, payload_checksum: bytes = UNSUMMED) -> RecordHeader:
        return RecordHeader(layout_fingerprint=FINGERPRINT, kind=KIND, abi_id=ABI_ID, token_start=i * 256,
                            token_end=(i + 1) * 256, keys=self.key(i, tag).reshape(1, 2),
                            payload_bytes=self.payload_bytes, payload_checksum=payload_checksum)


def one_run(store: RemoteStore, records: Records, buffer: np.ndarray, tag: int, hkv_first: bool,
            check: bool) -> dict[str, float]:
    """One run of every side on new keys (`tag`); seconds per side.  Its objects are removed after it."""
    client, n = store.client, len(records.payloads)
    names = [record_name(records.key(i, tag), KIND) for i in range(n)]
    headers = [records.header(i, tag) for i in range(n)]
    wanted = [Wanted(KIND, records.key(i, tag), i * 256, (i + 1) * 256, records.payload_bytes) for i in range(n)]
    raw_keys = [f"bench-raw/{tag}/{i}" for i in range(n)]
    image_bytes = HEADER_BYTES + records.payload_bytes
    pointers = [buffer.ctypes.data + i * image_bytes for i in range(n)]
    sizes = [image_bytes] * n
    published_before = store.counts["published"]
    got: list[Any] = []
    got_raw: list[bytes] = []
    codes: list[int] = []

    def publish() -> None:
        for name, header, payload in zip(names, headers, records.payloads, strict=True):
            store.publish(name, header, payload)
        store.drain()

    def put() -> None:
        for key, image in zip(raw_keys, records.images, strict=True):
            rc = client.put(key, image)
            if rc != 0:
                raise RuntimeError(f"put {key} returned {rc}")

    def fetch() -> None:
        got[:] = store.fetch(wanted)

    def get() -> None:
        for key in raw_keys:
            data = client.get(key)
            if len(data) != image_bytes:
                raise RuntimeError(f"get {key}: {len(data)} bytes, not {image_bytes}")
            if check:
                got_raw.append(data)

    def batch_get_into() -> None:
        codes[:] = client.batch_get_into(raw_keys, pointers, sizes)

    out: dict[str, float] = {}
    for first, second in ((publish, put), (fetch, get)) if hkv_first else ((put, publish), (get, fetch)):
        out[first.__name__] = timed(first)
        out[second.__name__] = timed(second)
    out["batch_get_into"] = timed(batch_get_into)
    if store.counts["published"] - published_before != n:
        raise RuntimeError(f"published {store.counts['published'] - published_before} of {n}: {store.report()}")
    if any(g is None for g in got):
        raise RuntimeError(f"fetched {sum(g is not None for g in got)} of {n}: {store.report()}")
    if codes != sizes:
        raise RuntimeError(f"batch_get_into returned {sorted(set(codes))}, not {image_bytes}")
    if check:  # not timed: what came back is what went in
        for i, (found, payload) in enumerate(zip(got, records.payloads, strict=True)):
            assert found[0] == "remote" and np.array_equal(found[1], payload), f"record {i} differs"
            assert got_raw[i] == records.images[i], f"raw object {i} differs"
            assert bytes(buffer[i * image_bytes:(i + 1) * image_bytes]) == records.images[i], f"raw batch {i} differs"
    store.release()
    for key in [store.key(name) for name in names] + raw_keys:
        client.remove(key, True)
    return out


def summary(runs: list[dict[str, float]], total: int) -> dict[str, Any]:
    def gbps(name: str) -> float:
        return round(total / statistics.median(r[name] for r in runs) / 1e9, 3)

    def ratio(ours: str, base: str) -> float:
        return round(statistics.median(r[base] for r in runs) / statistics.median(r[ours] for r in runs), 3)

    publish = {"gbps": gbps("publish"), "put_gbps": gbps("put"), "ratio": ratio("publish", "put")}
    fetch = {"gbps": gbps("fetch"), "get_gbps": gbps("get"), "ratio": ratio("fetch", "get"),
             "batch_get_into_gbps": gbps("batch_get_into"), "ratio_batch_get_into": ratio("fetch", "batch_get_into")}
    for figures in (publish, fetch):
        figures["pass"] = figures["ratio"] >= TARGET
    return {"publish": publish, "fetch": fetch,
            "seconds": {k: [round(r[k], 5) for r in runs] for k in runs[0]}}


def bench_mode(master: MooncakeMaster, zero_copy: bool, sets: dict[int, Records], runs: int, warmup: int,
               tags: Iterator[int]) -> dict[str, Any]:
    """Every payload size on one RemoteStore (and its client) with `zero_copy` on or off."""
    largest = max(len(r.payloads) * (HEADER_BYTES + r.payload_bytes) for r in sets.values())
    store = RemoteStore(master.config(zero_copy=zero_copy, **config_for(largest)), fingerprint=FINGERPRINT,
                        abi_id=ABI_ID, model_id=f"bench-remote-{zero_copy}")
    out: dict[str, Any] = {"registered": store.registered}
    try:
        buffer = np.zeros(largest, np.uint8)  # touched now: the batch_get_into baseline pays no first-touch faults
        if store.client.register_buffer(buffer.ctypes.data, buffer.nbytes) != 0:
            raise RuntimeError("register_buffer of the baseline's buffer failed")
        try:
            for kib, records in sets.items():
                counted = []
                for i in range(warmup + runs):
                    sample = one_run(store, records, buffer, next(tags), hkv_first=i % 2 == 0, check=i == warmup)
                    if i >= warmup:
                        counted.append(sample)
                total = len(records.payloads) * records.payload_bytes
                out[f"{kib}KiB"] = {"payload_bytes": records.payload_bytes, **summary(counted, total)}
        finally:
            store.client.unregister_buffer(buffer.ctypes.data)
        out["counts"] = dict(store.report()["counts"])
    finally:
        store.close()
    return out


def fx(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--payload-kib", type=int, nargs="+", default=None,
                        help="payload sizes, KiB (default 64 256 1024)")
    parser.add_argument("--records", type=int, default=None, help="records per run (default 64)")
    parser.add_argument("--runs", type=int, default=None, help="counted runs, median reported (default 5)")
    parser.add_argument("--warmup", type=int, default=None, help="runs before them, not counted (default 1)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 8 records of 64 KiB, 1 run, no warm-up (the flags above override it)")
    parser.add_argument("--json", action="store_true", help="print every figure as one JSON object")
    parser.add_argument("--json-out", default=None, help="also write the JSON object to this file")
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else DEFAULTS
    chosen = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in defaults.items()}
    kibs: list[int] = chosen["payload_kib"]
    count: int = chosen["records"]
    runs: int = chosen["runs"]
    warmup: int = chosen["warmup"]
    if min(kibs) < 1 or count < 1 or runs < 1 or warmup < 0:
        parser.error("--payload-kib, --records and --runs must be >= 1, --warmup >= 0")
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")  # read when a client is set up (below), unlike GLOG_minloglevel
    started = time.perf_counter()
    sets = {kib: Records(count, kib * 1024, seed=kib) for kib in kibs}
    tags = iter(range(1, 1 << 62))  # every run's keys are new (a put of a key the store holds is a no-op)
    result: dict[str, Any] = {
        "commit": code_version("hkv_core", "hkv_exec_ref"), "python": sys.version.split()[0], "numpy": np.__version__,
        "mooncake": importlib.metadata.version("mooncake-transfer-engine-non-cuda"),
        "records": count, "payload_kib": kibs, "runs": runs, "warmup": warmup, "target_ratio": TARGET,
        "config": config_for(max(count * (HEADER_BYTES + kib * 1024) for kib in kibs)),
        "baseline_client": "the RemoteStore's own client",
    }
    with MooncakeMaster() as master:
        for section, zero_copy in MODES.items():
            result[section] = bench_mode(master, zero_copy, sets, runs, warmup, tags)
    result["seconds"] = round(time.perf_counter() - started, 1)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"code {result['commit']}, mooncake {result['mooncake']}: {count} records a run, median of {runs} runs "
          f"(+{warmup} warm-up), GB/s of payload, target {TARGET}x; {result['seconds']} s")
    print(f"{'mode':<10} {'payload':>8}  {'op':<8} {'hkv':>7} {'raw':>7} {'ratio':>6} {'target':>6}   "
          f"{'raw batch_get_into':>18} {'ratio':>6}")
    for section in MODES:
        for kib in kibs:
            r = result[section][f"{kib}KiB"]
            p, f = r["publish"], r["fetch"]
            print(f"{section:<10} {kib:>5} KiB  {'publish':<8} {p['gbps']:>7.2f} {p['put_gbps']:>7.2f} "
                  f"{p['ratio']:>5.2f}x {fx(p['pass']):>6}")
            print(f"{section:<10} {kib:>5} KiB  {'fetch':<8} {f['gbps']:>7.2f} {f['get_gbps']:>7.2f} "
                  f"{f['ratio']:>5.2f}x {fx(f['pass']):>6}   {f['batch_get_into_gbps']:>18.2f} "
                  f"{f['ratio_batch_get_into']:>5.2f}x")
    print("raw: put / get of the same images one after another on the same client; ratio = hkv / raw")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
