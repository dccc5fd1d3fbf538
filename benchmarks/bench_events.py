"""What KV cache events cost the request path: the shared-prefix workload with events off and on.

The workload of the peer harness (requests of 4,096 tokens, 3,072 of them one
of 20 system prompts, block 16, pools of 65,536 pages, so eviction runs in the
second half).  Three managers in the same process, runs interleaved: events
off (the baseline), events on and taken after every request (what a router
feed does), and events on, taken and encoded for ZeroMQ (`hkv_events.wire`,
when the `events` extra is installed; nothing is sent).  Prints the median us
per request of each and its ratio to the baseline; it never asserts timings.

    .venv/bin/python benchmarks/bench_events.py [--layout deepseek_v4_flash] [--requests 2000] [--runs 3]
        [--json-out benchmarks/results/bench_events.json]   # also the figures as JSON (the README renders them)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from bench_manager import code_version  # this script's folder is on sys.path when it runs

from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig
from hkv_core.plan import Completion

PROMPT_TOKENS, SHARED_TOKENS, SYSTEM_PROMPTS, BLOCK_TOKENS, POOL_PAGES = 4096, 3072, 20, 16, 65_536
DONE = Completion()


def prompts(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1234)
    system = rng.integers(0, 150_000, size=(SYSTEM_PROMPTS, SHARED_TOKENS), dtype=np.int64)
    which = rng.integers(0, SYSTEM_PROMPTS, size=n)
    tails = rng.integers(0, 150_000, size=(n, PROMPT_TOKENS - SHARED_TOKENS), dtype=np.int64)
    return [np.concatenate([system[which[i]], tails[i]]) for i in range(n)]


def serve(m: CacheManager, tokens: np.ndarray) -> None:
    rid = m.add_request(tokens)
    hit = m.match(rid)
    m.acquire(rid, hit)
    todo = len(tokens) - hit.tokens
    plan = m.allocate(rid, todo).plan
    if plan is not None:
        m.complete(plan.plan_id, DONE)
    m.commit(rid, todo)
    m.release(rid)


def run(layout: Layout, work: list[np.ndarray], events: bool, after: Callable[[CacheManager], object]) -> float:
    """Thread CPU us per request of one pass over `work` on a fresh manager."""
    m = CacheManager(layout, ManagerConfig(default_pool_pages=POOL_PAGES, key_seed=1, kv_events=events))
    start = time.thread_time()
    for tokens in work:
        serve(m, tokens)
        after(m)
    return (time.thread_time() - start) / len(work) * 1e6


def variants() -> dict[str, tuple[bool, Callable[[CacheManager], object]]]:
    out: dict[str, tuple[bool, Callable[[CacheManager], object]]] = {
        "events off (baseline)": (False, lambda m: None),
        "events on, take_events every request": (True, lambda m: m.take_events()),
    }
    try:
        from hkv_events.wire import encode_batch
    except ImportError:
        print("(hkv_events not installed: pip install 'hkv[events]' for the encoding variant)")
        return out
    out["events on, taken and encoded (msgpack)"] = (True, lambda m: encode_batch(m.take_events()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", default="deepseek_v4_flash")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json-out", default=None, help="also write the figures as JSON to this file")
    args = parser.parse_args()
    layout = Layout.from_preset(args.layout, block_tokens=BLOCK_TOKENS)
    work = prompts(args.requests)
    cases = variants()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):  # interleaved: drift of a shared machine hits every variant alike
        for name, (events, after) in cases.items():
            times[name].append(run(layout, work, events, after))
    base = statistics.median(times["events off (baseline)"])
    print(f"{args.layout}, {args.requests} requests of {PROMPT_TOKENS} tokens, median of {args.runs} runs "
          "(thread CPU time)")
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, us in medians.items():
        print(f"  {name:<42} {us:8.0f} us/request   {us / base:5.2f}x baseline")
    if args.json_out:
        report = {"commit": code_version(), "layout": args.layout, "requests": args.requests, "runs": args.runs,
                  "us_per_request": medians, "ratio_to_baseline": {k: v / base for k, v in medians.items()}}
        Path(args.json_out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
