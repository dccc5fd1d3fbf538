"""Benchmark of the CacheManager request path, beside published peer figures and the targets.

    .venv/bin/python benchmarks/bench_manager.py [--json] [--json-out F] [--quick] [--runs N]
                                                 [--only shared|long] [--layout NAME] [--clock cpu|wall]
    .venv/bin/python benchmarks/bench_manager.py --profile [--profiler cprofile|pyinstrument]
                                                 [--profile-layout NAME] [--requests N]

(a) shared prefix: requests of 4,096 tokens whose first 3,072 tokens are one of
    20 seeded system prompts (block 16), run one after another through
    add_request (hashes the prompt) + match + acquire + allocate(every remaining
    prompt token) + commit + release, on llama_full and on deepseek_v4_flash
    (block 16).  Figures: microseconds per request (median over the runs of
    each run's mean), per phase, and the hit rate.  Hashing is also timed on
    its own with `core.hasher.hash_blocks` on the same tokens (that call is not
    part of the per-request total; add_request's own hashing is).
(b) one 1,048,576-token prompt (65,536 blocks): hash, allocate + commit in
    chunks of 8,192 tokens, then a second identical request's hash and match;
    and the index's metadata bytes per block (its tables, allocated at construction).

Timings are this thread's CPU time unless `--clock wall`.  Figures are medians
over the runs (each run is listed too); nothing asserts on timings (this file
is a benchmark, not a test).  A manager error (e.g. OutOfPages) is reported
for that workload and the exit status is 1.  `--quick` shrinks both workloads
for a smoke test.  `--profile` runs the shared-prefix workload under a
profiler instead.  Results and hotspots: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib
import json
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hkv_core.block_keys import ExtraKeys  # noqa: E402
from hkv_core.errors import HkvError  # noqa: E402
from hkv_core.layout import Layout  # noqa: E402
from hkv_core.manager import CacheManager, ManagerConfig  # noqa: E402
from hkv_core.plan import Completion  # noqa: E402

# ---------------------------------------------------------------- constants

BLOCK = 16
SEED = 1
VOCAB = 128_000
SYSTEM_PROMPTS = 20
PROMPT_TOKENS = 4_096
SHARED_TOKENS = 3_072
REQUESTS = 2_000
QUICK_REQUESTS = 40
LONG_TOKENS = 1_048_576
QUICK_LONG_TOKENS = 16_384
CHUNK_TOKENS = 8_192
DECODE_STEPS = 64  # one-token decode steps timed on the long context after its prefill
RUNS = 3
QUICK_RUNS = 1
DONE = Completion()

LAYOUTS: dict[str, Callable[[], Layout]] = {
    "llama_full": lambda: Layout.from_preset("llama_full"),
    "deepseek_v4_flash_b16": lambda: Layout.from_preset("deepseek_v4_flash", block_tokens=BLOCK),
}

# Published peer figures (same workloads, as given in the task brief) and the targets.
PEERS_SHARED_US = {
    "vLLM 0.33 KVCacheManager": 1358.0,
    "vLLM 0.33 hybrid (sliding window)": 1420.0,
    "SGLang 0.5 RadixCache": 620.0,
    "SGLang 0.5 SWARadixCache": 826.0,
}
PEER_VLLM_HASH_US = 802.0  # of vLLM's 1,358 us per request
# The peer each layout is naturally compared with (full attention / hybrid).
PEERS_FOR = {
    "llama_full": ("vLLM 0.33 KVCacheManager", "SGLang 0.5 RadixCache"),
    "deepseek_v4_flash_b16": ("vLLM 0.33 hybrid (sliding window)", "SGLang 0.5 SWARadixCache"),
}
TARGET_SHARED_US = {"llama_full": 300.0, "deepseek_v4_flash_b16": 400.0}
PEERS_LONG: dict[str, dict[str, float | None]] = {
    "SGLang": {"hash_ms": 25.0, "match_ms": 7.0, "bytes_per_block": None},
    "vLLM": {"hash_ms": 210.0, "match_ms": 60.0, "bytes_per_block": 265.0},
}
TARGET_LONG: dict[str, float] = {"hash_ms": 25.0, "match_ms": 10.0, "bytes_per_block": 64.0}

PHASES = ("add_request", "match", "acquire", "allocate", "commit", "release")


CLOCKS: dict[str, Callable[[], int]] = {"cpu": time.thread_time_ns, "wall": time.perf_counter_ns}
_clock = CLOCKS["cpu"]


def ns() -> int:
    """The benchmark clock: this thread's CPU time by default (other processes on the host do not
    inflate it), wall time with --clock wall."""
    return _clock()


def clock_overhead_ns() -> float:
    """Median cost of one clock reading (each timed phase carries about one of these)."""
    samples = []
    for _ in range(2_000):
        a = ns()
        b = ns()
        samples.append(b - a)
    return float(statistics.median(samples))


def ratio(value: float, reference: float | None) -> float | None:
    return None if reference is None or not reference else value / reference


# ---------------------------------------------------------------- (a) shared prefix


def shared_workload(requests: int, seed: int = SEED) -> tuple[list[np.ndarray], list[int]]:
    """Token arrays (int32) of every request and the index of its system prompt."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, VOCAB, SHARED_TOKENS, dtype=np.int32) for _ in range(SYSTEM_PROMPTS)]
    which = rng.integers(0, SYSTEM_PROMPTS, requests).tolist()
    suffixes = rng.integers(0, VOCAB, (requests, PROMPT_TOKENS - SHARED_TOKENS), dtype=np.int32)
    return [np.concatenate([prompts[w], suffixes[i]]) for i, w in enumerate(which)], which


def shared_pool_pages(requests: int) -> int:
    """Pages per pool: the 20 system prompts plus the unique suffixes of half the requests.

    The busiest pools (llama's one pool, V4-Flash's csa.compressed_kv) take one
    page per block: 20 x 192 pages for the system prompts and 64 per request
    for its unique suffix, all of it kept in the index.  So the pools fill at
    about the middle of the run and eviction (LRU, unreferenced suffix leaves
    first) runs on the later requests only.
    """
    prompt_pages = SYSTEM_PROMPTS * SHARED_TOKENS // BLOCK
    suffix_pages = (PROMPT_TOKENS - SHARED_TOKENS) // BLOCK
    return prompt_pages + (requests // 2) * suffix_pages


def run_shared(layout: Layout, requests: list[np.ndarray], pool_pages: int, hash_alone: bool = True) -> dict[str, Any]:
    """One run over a fresh manager: per request, per phase nanoseconds; hit tokens; evictions."""
    m = CacheManager(layout, ManagerConfig(default_pool_pages=pool_pages, key_seed=SEED))
    core, extra = m.core, ExtraKeys()
    n = len(requests)
    times = {p: np.zeros(n, np.int64) for p in (*PHASES, "hashing")}
    hits = np.zeros(n, np.int64)
    evicted = np.zeros(n, np.int64)
    gc.collect()
    for i, tokens in enumerate(requests):
        t0 = ns()
        rid = m.add_request(tokens)
        t1 = ns()
        found = m.match(rid)
        t2 = ns()
        m.acquire(rid, found)
        t3 = ns()
        before = core.stats["evicted_blocks"] + core.stats["evicted_points"]
        todo = len(tokens) - found.tokens
        t4 = ns()
        allocate(m, rid, todo)
        t5 = ns()
        m.commit(rid, todo)
        t6 = ns()
        m.release(rid)
        t7 = ns()
        if hash_alone:
            core.hasher.hash_blocks(tokens, extra)  # hashing alone, on the same tokens
        t8 = ns()
        for phase, dt in zip((*PHASES, "hashing"), (t1 - t0, t2 - t1, t3 - t2, t5 - t4, t6 - t5, t7 - t6, t8 - t7),
                             strict=True):
            times[phase][i] = dt
        hits[i] = found.tokens
        evicted[i] = core.stats["evicted_blocks"] + core.stats["evicted_points"] - before
    total = sum(times[p] for p in PHASES)
    return {"times": times, "total": total, "hits": hits, "evicted": evicted, "stats": dict(core.stats)}


def bench_shared(name: str, requests: list[np.ndarray], runs: int, pool_pages: int) -> dict[str, Any]:
    layout = LAYOUTS[name]()
    warm_up(layout)
    results = [run_shared(layout, requests, pool_pages) for _ in range(runs)]
    per_run = [float(r["total"].mean()) / 1e3 for r in results]
    median_index = int(np.argsort(per_run)[len(per_run) // 2])
    mid = results[median_index]
    prompt_tokens = sum(len(t) for t in requests)
    evicting = mid["evicted"] > 0
    us = statistics.median(per_run)
    out: dict[str, Any] = {
        "layout": name,
        "pools": [p.name for p in layout.pools],
        "pool_pages": pool_pages,
        "requests": len(requests),
        "runs": runs,
        "us_per_request": us,
        "us_per_request_runs": per_run,
        "us_per_request_p50": float(np.percentile(mid["total"], 50)) / 1e3,
        "us_per_request_p99": float(np.percentile(mid["total"], 99)) / 1e3,
        "phases_us": {p: statistics.median(float(r["times"][p].mean()) / 1e3 for r in results)
                      for p in (*PHASES, "hashing")},
        "hit_rate_tokens": float(mid["hits"].sum()) / prompt_tokens,
        "full_hit_fraction": float(np.mean(mid["hits"] >= SHARED_TOKENS)),
        "evicting_request_fraction": float(evicting.mean()),
        "us_per_request_evicting": float(mid["total"][evicting].mean()) / 1e3 if evicting.any() else None,
        "us_per_request_not_evicting": float(mid["total"][~evicting].mean()) / 1e3 if (~evicting).any() else None,
        "evicted_blocks": mid["stats"]["evicted_blocks"],
        "evicted_points": mid["stats"]["evicted_points"],
        "copies": mid["stats"]["copies"],
        "target_us": TARGET_SHARED_US[name],
        "ratio_to_target": ratio(us, TARGET_SHARED_US[name]),
        "peers": {peer: {"us": peer_us, "ratio": ratio(us, peer_us)} for peer, peer_us in PEERS_SHARED_US.items()},
        "compare_with": list(PEERS_FOR[name]),
    }
    out["phases_us"]["add_request_minus_hashing"] = out["phases_us"]["add_request"] - out["phases_us"]["hashing"]
    out["hashing_ratio_to_vllm"] = ratio(out["phases_us"]["hashing"], PEER_VLLM_HASH_US)
    return out


# ---------------------------------------------------------------- (b) one long prompt


def long_pool_pages(tokens: int) -> int:
    """Enough pages in every pool for the whole prompt (one page per block is the most any pool takes)."""
    return tokens // BLOCK + 2 * CHUNK_TOKENS // BLOCK


def run_long(layout: Layout, tokens: np.ndarray, pool_pages: int) -> dict[str, float]:
    """Times (ms) of one run: first request through chunked prefill, then an identical second request."""
    m = CacheManager(layout, ManagerConfig(default_pool_pages=pool_pages, key_seed=SEED))
    core, extra = m.core, ExtraKeys()
    out: dict[str, float] = {}
    gc.collect()
    t0 = ns()
    core.hasher.hash_blocks(tokens, extra)
    t1 = ns()
    rid = m.add_request(tokens)
    t2 = ns()
    m.acquire(rid, m.match(rid))
    alloc_ns = commit_ns = 0
    for start in range(0, len(tokens), CHUNK_TOKENS):
        step = min(CHUNK_TOKENS, len(tokens) - start)
        a = ns()
        allocate(m, rid, step)
        b = ns()
        m.commit(rid, step)
        c = ns()
        alloc_ns, commit_ns = alloc_ns + b - a, commit_ns + c - b
    t3 = ns()
    decode_us = decode_steps(m, rid)
    t3b = ns()
    m.release(rid)
    t4 = ns()
    core.hasher.hash_blocks(tokens, extra)
    t5 = ns()
    rid2 = m.add_request(tokens)
    t6 = ns()
    found = m.match(rid2)
    t7 = ns()
    m.acquire(rid2, found)
    t8 = ns()
    m.release(rid2)
    t9 = ns()
    out.update(hash_ms=(t1 - t0) / 1e6, add_request_ms=(t2 - t1) / 1e6,
               allocate_commit_ms=(t3 - t2) / 1e6, allocate_ms=alloc_ns / 1e6, commit_ms=commit_ns / 1e6,
               release_ms=(t4 - t3b) / 1e6, decode_step_us=decode_us, hash2_ms=(t5 - t4) / 1e6,
               add_request2_ms=(t6 - t5) / 1e6,
               match_ms=(t7 - t6) / 1e6, acquire2_ms=(t8 - t7) / 1e6, release2_ms=(t9 - t8) / 1e6,
               hit_tokens=float(found.tokens))
    return out


def warm_up(layout: Layout) -> None:
    """Run every manager path once (lazy imports, first-call caches) before anything is measured."""
    m = CacheManager(layout, ManagerConfig(default_pool_pages=1024, key_seed=SEED))
    tokens = np.random.default_rng(0).integers(0, VOCAB, 2_048, dtype=np.int32)
    for end in (1_024, 2_048, 2_048):
        rid = m.add_request(tokens[:end])
        found = m.match(rid)
        m.acquire(rid, found)
        todo = end - found.tokens
        for step in (todo // 2, todo - todo // 2):
            allocate(m, rid, step)
            m.commit(rid, step)
        m.release(rid)
    m.evict()


def measure_long_memory(layout: Layout, tokens: np.ndarray, pool_pages: int) -> dict[str, Any]:
    """Bytes of the prefix index per 16-token block, with the whole prompt indexed.

    Every table of the index (blocks, resume points, key table, eviction
    order) is allocated at its full size when the manager is built, sized
    from the pools (docs/limits.md); the figure is their bytes over the
    blocks of the prompt, which fills them (the pools hold the whole prompt
    and not much more).  The request's own tables (its chain, page tables,
    tokens and keys) are not index metadata and are not counted.
    """
    blocks = len(tokens) // BLOCK
    m = CacheManager(layout, ManagerConfig(default_pool_pages=pool_pages, key_seed=SEED))
    built = m.core.index.nbytes()
    rid = m.add_request(tokens)
    m.acquire(rid, m.match(rid))
    for start in range(0, len(tokens), CHUNK_TOKENS):
        step = min(CHUNK_TOKENS, len(tokens) - start)
        allocate(m, rid, step)
        m.commit(rid, step)
    m.release(rid)
    counts = m.index_counts()
    total = sum(built.values())
    return {
        "blocks": blocks,
        "blocks_indexed": counts["blocks"],
        "points_kept": counts["points"],
        "bytes_per_block": total / blocks,
        "bytes_per_block_by_table": {k: v / blocks for k, v in built.items()},
        "block_rows": m.core.limits.block_rows,
        "point_rows": m.core.limits.point_rows,
        "key_table_slots": m.core.limits.key_table_slots,
    }


def allocate(m: CacheManager, rid: int, count: int) -> None:
    """allocate, and complete its copy plan at once (no executor here moves bytes)."""
    plan = m.allocate(rid, count).plan
    if plan is not None:
        m.complete(plan.plan_id, DONE)

def decode_steps(m: CacheManager, rid: int) -> float:
    """Median us of DECODE_STEPS decode steps (append_tokens(1) + allocate(1) + commit(1)) on the long context."""
    times = []
    for step in range(DECODE_STEPS):
        a = ns()
        m.append_tokens(rid, np.array([step % 1000]))
        allocate(m, rid, 1)
        m.commit(rid, 1)
        times.append((ns() - a) / 1e3)
    return statistics.median(times)


def bench_long(name: str, tokens: np.ndarray, runs: int) -> dict[str, Any]:
    layout = LAYOUTS[name]()
    pool_pages = long_pool_pages(len(tokens))
    warm_up(layout)
    results = [run_long(layout, tokens, pool_pages) for _ in range(runs)]
    med = {k: statistics.median(r[k] for r in results) for k in results[0]}
    memory = measure_long_memory(layout, tokens, pool_pages)
    figures = {"hash_ms": med["hash_ms"], "match_ms": med["match_ms"], "bytes_per_block": memory["bytes_per_block"]}
    return {
        "layout": name,
        "tokens": len(tokens),
        "blocks": len(tokens) // BLOCK,
        "chunk_tokens": CHUNK_TOKENS,
        "pool_pages": pool_pages,
        "runs": runs,
        "ms": med,
        "ms_runs": results,
        "memory": memory,
        "targets": TARGET_LONG,
        "ratio_to_target": {k: ratio(v, TARGET_LONG[k]) for k, v in figures.items()},
        "peers": {peer: {k: {"value": pv, "ratio": ratio(figures[k], pv)} for k, pv in vals.items()}
                  for peer, vals in PEERS_LONG.items()},
    }


# ---------------------------------------------------------------- output


def fx(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}x"


def print_shared(r: dict[str, Any]) -> None:
    print(f"\n(a) shared prefix, {r['layout']}: {r['requests']} requests x {PROMPT_TOKENS} tokens "
          f"({SHARED_TOKENS} from one of {SYSTEM_PROMPTS} system prompts), block {BLOCK}, "
          f"{len(r['pools'])} pool(s) of {r['pool_pages']} pages, median of {r['runs']} runs")
    print(f"  per request      {r['us_per_request']:>10.1f} us   (runs: "
          + ", ".join(f"{x:.0f}" for x in r["us_per_request_runs"])
          + f"; p50 {r['us_per_request_p50']:.0f}, p99 {r['us_per_request_p99']:.0f})")
    ph = r["phases_us"]
    for phase in PHASES:
        share = 100 * ph[phase] / r["us_per_request"]
        print(f"    {phase:<14} {ph[phase]:>10.1f} us   {share:5.1f}%")
    print(f"    (hashing alone {ph['hashing']:>8.1f} us, inside add_request; vLLM hashes in {PEER_VLLM_HASH_US:.0f} us:"
          f" {fx(r['hashing_ratio_to_vllm'])})")
    print(f"  hit rate {100 * r['hit_rate_tokens']:.1f}% of prompt tokens; "
          f"{100 * r['full_hit_fraction']:.1f}% of requests hit >= {SHARED_TOKENS} tokens")
    ev, nev = r["us_per_request_evicting"], r["us_per_request_not_evicting"]
    print(f"  eviction on {100 * r['evicting_request_fraction']:.1f}% of requests "
          f"({r['evicted_blocks']} blocks, {r['evicted_points']} points evicted); "
          f"us/request with eviction {ev if ev is None else round(ev)}, without {nev if nev is None else round(nev)}")
    print(f"  target < {r['target_us']:.0f} us: {fx(r['ratio_to_target'])} the target")
    for peer, v in r["peers"].items():
        mark = "  <- same class" if peer in r["compare_with"] else ""
        print(f"  vs {peer:<36} {v['us']:>7.0f} us: {fx(v['ratio'])}{mark}")


def print_long(r: dict[str, Any]) -> None:
    ms, mem = r["ms"], r["memory"]
    print(f"\n(b) one {r['tokens']:,}-token prompt ({r['blocks']:,} blocks of {BLOCK}), {r['layout']}, "
          f"pools of {r['pool_pages']} pages, chunks of {r['chunk_tokens']}, median of {r['runs']} runs")
    print(f"  hash (hash_blocks)          {ms['hash_ms']:>10.1f} ms   target < {TARGET_LONG['hash_ms']:.0f}: "
          f"{fx(r['ratio_to_target']['hash_ms'])}; SGLang 25 ms: {fx(r['peers']['SGLang']['hash_ms']['ratio'])}; "
          f"vLLM 210 ms: {fx(r['peers']['vLLM']['hash_ms']['ratio'])}")
    print(f"  add_request (hash inside)   {ms['add_request_ms']:>10.1f} ms")
    print(f"  allocate + commit           {ms['allocate_commit_ms']:>10.1f} ms   (allocate {ms['allocate_ms']:.1f}, "
          f"commit {ms['commit_ms']:.1f})")
    print(f"  decode step at that context {ms['decode_step_us']:>10.1f} us   (append_tokens + allocate + commit of one"
          f" token, median of {DECODE_STEPS})")
    print(f"  release                     {ms['release_ms']:>10.1f} ms")
    print(f"  2nd request: hash           {ms['hash2_ms']:>10.1f} ms   add_request {ms['add_request2_ms']:.1f} ms")
    print(f"  2nd request: match          {ms['match_ms']:>10.1f} ms   target < {TARGET_LONG['match_ms']:.0f}: "
          f"{fx(r['ratio_to_target']['match_ms'])}; SGLang 7 ms: {fx(r['peers']['SGLang']['match_ms']['ratio'])}; "
          f"vLLM 60 ms: {fx(r['peers']['vLLM']['match_ms']['ratio'])}  (hit {int(ms['hit_tokens']):,} tokens)")
    print(f"  2nd request: acquire        {ms['acquire2_ms']:>10.1f} ms   release {ms['release2_ms']:.1f} ms")
    print(f"  index metadata              {mem['bytes_per_block']:>10.1f} B/block   target < "
          f"{TARGET_LONG['bytes_per_block']:.0f}: {fx(r['ratio_to_target']['bytes_per_block'])}; "
          f"vLLM ~265: {fx(r['peers']['vLLM']['bytes_per_block']['ratio'])}")
    tables = ", ".join(f"{k} {v:.1f}" for k, v in mem["bytes_per_block_by_table"].items())
    print(f"    every index table, allocated at construction, over the prompt's blocks (B/block): {tables}; "
          f"{mem['block_rows']:,} block rows, {mem['point_rows']:,} point rows, {mem['key_table_slots']:,} key "
          f"slots; {mem['blocks_indexed']:,} blocks and {mem['points_kept']:,} points indexed")


# ---------------------------------------------------------------- profile


def profile_sampling(name: str, requests: list[np.ndarray], pool_pages: int, out: str | None) -> None:
    """pyinstrument (a sampling profiler, optional: `.venv/bin/pip install pyinstrument`) over the workload."""
    try:
        module = importlib.import_module("pyinstrument")
    except ImportError:
        raise SystemExit("pyinstrument is not installed (.venv/bin/pip install pyinstrument), "
                         "or use --profiler cprofile") from None
    layout = LAYOUTS[name]()
    warm_up(layout)
    profiler = module.Profiler(interval=0.0005)
    profiler.start()
    result = run_shared(layout, requests, pool_pages, hash_alone=False)
    profiler.stop()
    n = len(requests)
    print(f"pyinstrument of the shared-prefix workload on {name}: {n} requests, pools of {pool_pages} pages; "
          f"{float(result['total'].mean()) / 1e3:.0f} us/request ({_clock.__name__}) under the profiler")
    print(profiler.output_text(unicode=False, color=False))
    if out:
        Path(out).write_text(profiler.output_html())


def profile(name: str, requests: list[np.ndarray], pool_pages: int, top: int, out: str | None) -> None:
    """cProfile over the workload: top functions by cumulative and by own time."""
    layout = LAYOUTS[name]()
    warm_up(layout)
    profiler = cProfile.Profile()
    profiler.enable()
    result = run_shared(layout, requests, pool_pages, hash_alone=False)
    profiler.disable()
    if out:
        profiler.dump_stats(out)
    n = len(requests)
    stats = pstats.Stats(profiler)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = float(stats.total_tt)  # type: ignore[attr-defined]
    print(f"cProfile of the shared-prefix workload on {name}: {n} requests, pools of {pool_pages} pages; "
          f"{total / n * 1e6:.0f} us/request under the profiler (wall clock, profiler overhead included); "
          f"hit rate {100 * float(result['hits'].sum()) / sum(len(t) for t in requests):.1f}%")
    rows: list[tuple[float, float, int, str]] = []
    for (path, line, func), (_cc, calls, tottime, cumtime, _callers) in raw.items():
        rows.append((float(cumtime), float(tottime), int(calls), f"{Path(path).name}:{line}({func})"))
    for label, col in (("cumulative", 0), ("own time", 1)):
        print(f"\n  top {top} by {label}: % of profiled time, us/request, calls/request, function")
        for row in sorted(rows, key=lambda r: -float(r[col]))[:top]:
            secs = float(row[col])
            print(f"    {100 * secs / total:6.1f}%  {secs / n * 1e6:9.1f} us  {row[2] / n:9.1f}  {row[3]}")


# ---------------------------------------------------------------- main


def code_version(*packages: str) -> str:
    """The git commit of the code measured, with a '+dirty' mark when any of `packages` (default: hkv_core) has
    local changes; every benchmark names its runs with it."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", *(packages or ("hkv_core",))], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + ("+dirty" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print every figure as one JSON object")
    parser.add_argument("--json-out", default=None, help="also write the JSON object to this file")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="cpu",
                        help="cpu: this thread's CPU time (default; robust on a shared host); wall: perf_counter")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_REQUESTS} requests and a {QUICK_LONG_TOKENS:,}-token long prompt (a smoke test)")
    parser.add_argument("--runs", type=int, default=None,
                        help=f"runs per figure, median reported (default {RUNS}, {QUICK_RUNS} with --quick)")
    parser.add_argument("--requests", type=int, default=None, help="shared-prefix requests (overrides --quick)")
    parser.add_argument("--long-tokens", type=int, default=None, help="long prompt tokens (overrides --quick)")
    parser.add_argument("--pool-pages", type=int, default=None, help="shared-prefix pages per pool")
    parser.add_argument("--only", choices=("shared", "long"), default=None)
    parser.add_argument("--layout", choices=tuple(LAYOUTS), action="append", default=None,
                        help="restrict to these layouts (repeatable)")
    parser.add_argument("--profile", action="store_true", help="profile the shared-prefix workload instead")
    parser.add_argument("--profiler", choices=("cprofile", "pyinstrument"), default="cprofile")
    parser.add_argument("--profile-layout", choices=tuple(LAYOUTS), default="deepseek_v4_flash_b16")
    parser.add_argument("--profile-top", type=int, default=25)
    parser.add_argument("--profile-out", default=None,
                        help="also write the profile here (cProfile: pstats dump; pyinstrument: HTML)")
    args = parser.parse_args(argv)
    global _clock
    _clock = CLOCKS[args.clock]

    args.runs = args.runs or (QUICK_RUNS if args.quick else RUNS)
    n_requests = args.requests or (QUICK_REQUESTS if args.quick else REQUESTS)
    long_tokens = args.long_tokens or (QUICK_LONG_TOKENS if args.quick else LONG_TOKENS)
    if long_tokens % BLOCK:
        parser.error(f"--long-tokens must be a multiple of {BLOCK}")
    pool_pages = args.pool_pages or shared_pool_pages(n_requests)
    layouts = args.layout or list(LAYOUTS)
    requests, _ = shared_workload(n_requests)

    if args.profile and args.profiler == "pyinstrument":
        profile_sampling(args.profile_layout, requests, pool_pages, args.profile_out)
        return 0
    if args.profile:
        profile(args.profile_layout, requests, pool_pages, args.profile_top, args.profile_out)
        return 0

    report: dict[str, Any] = {
        "config": {"quick": args.quick, "runs": args.runs, "requests": n_requests, "prompt_tokens": PROMPT_TOKENS,
                   "shared_tokens": SHARED_TOKENS, "system_prompts": SYSTEM_PROMPTS, "block_tokens": BLOCK,
                   "shared_pool_pages": pool_pages, "long_tokens": long_tokens, "chunk_tokens": CHUNK_TOKENS,
                   "seed": SEED, "clock": args.clock, "clock_overhead_ns": clock_overhead_ns(),
                   "code": code_version(), "python": sys.version.split()[0], "numpy": np.__version__},
        "peers": {"shared_us": PEERS_SHARED_US, "vllm_hash_us": PEER_VLLM_HASH_US, "long": PEERS_LONG},
        "targets": {"shared_us": TARGET_SHARED_US, "long": TARGET_LONG},
        "shared_prefix": {},
        "long_prompt": {},
    }
    if not args.json:
        cfg = report["config"]
        print(f"code {cfg['code']}; clock: {args.clock} ({cfg['clock_overhead_ns']:.0f} ns per reading); "
              f"python {cfg['python']}, "
              f"numpy {cfg['numpy']}; ratios are ours / theirs (> 1: slower or bigger than the reference)")
    failed = False
    tokens = np.random.default_rng(SEED + 1).integers(0, VOCAB, long_tokens, dtype=np.int32)
    def shared(name: str) -> dict[str, Any]:
        return bench_shared(name, requests, args.runs, pool_pages)

    def long(name: str) -> dict[str, Any]:
        return bench_long(name, tokens, args.runs)

    parts: tuple[tuple[str, Callable[[str], dict[str, Any]], Callable[[dict[str, Any]], None]], ...] = (
        ("shared_prefix", shared, print_shared), ("long_prompt", long, print_long))
    for part, bench, show in parts:
        if args.only is not None and not part.startswith(args.only):
            continue
        for name in layouts:
            try:
                result = bench(name)
            except HkvError as error:  # the manager refused the workload: report it, go on
                failed = True
                report[part][name] = {"layout": name, "error": f"{type(error).__name__}: {error}"}
                if not args.json:
                    print(f"\n{part}, {name}: FAILED with {type(error).__name__}: {error}")
                continue
            report[part][name] = result
            if not args.json:
                show(result)
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
