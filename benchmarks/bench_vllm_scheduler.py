"""vLLM's real scheduler loop with its stock KV cache manager and with hkv's adapter, same workloads, one run.

    .venv-vllm/bin/python benchmarks/bench_vllm_scheduler.py [--quick] [--repeats N] [--json] [--json-out F]

No model runs: each step is vLLM's `schedule()` and `update_from_output()`
with faked outputs (`hkv_vllm/drive.py`), so the figure is the scheduler's
own CPU time (this process's `time.process_time`), manager included.
Workloads (block 16, one full-attention group unless named):

- W1: requests of 4,096 tokens whose first 3,072 are one of 20 system
  prompts (the peer harness's W1, fewer requests), 64 arriving per step,
  2 output tokens each, in a pool of 65,536 blocks;
- W3: W1's requests on a hybrid, a full-attention group beside a 128-token
  sliding-window group (the peer harness's W3), in 131,072 blocks (hkv
  splits them evenly between the groups);
- decode: 256 requests of 512 tokens, then 64 decode steps of one token each;
- trace: the shared Mooncake trace's first requests (hash ids as tokens,
  prompts cut to 8,192 tokens), 16 arriving per step, in 16,384 blocks
  (evictions); skipped with a message when ../shared/traces is absent.

Stock and hkv runs alternate (A B A B ...); each figure is the median over the repeats of
CPU microseconds per scheduler step and per request, and the ratio hkv /
stock of the medians; "+ building" is the CPU time per request of building
the vLLM `Request`s (vLLM hashes each prompt's blocks there, with either
manager), and the second ratio counts it on both sides.  Nothing asserts on
timings.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
TRACE = ROOT.parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
BLOCK = 16
TRACE_BLOCK = 512  # tokens per hash id in the Mooncake trace


def setup_environment() -> None:
    """vLLM on CPU with the config-only hub cache, before vLLM is imported."""
    import os
    import tempfile

    from hkv_vllm.suite.hub_cache import write_hub_cache

    hub = Path(tempfile.mkdtemp(prefix="hkv-bench-hub-"))
    write_hub_cache(hub)
    os.environ.update(VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_CACHE=str(hub),
                      VLLM_ALLOW_LONG_MAX_MODEL_LEN="1")


Arrival = tuple[int, str, list[int], int]  # (step, request id, prompt, output tokens)
Workload = tuple[list[Arrival], dict[str, Any]]  # arrivals, build_scheduler arguments


def w1(requests: int) -> Workload:
    rng = random.Random(1)
    systems = [[rng.randrange(50_000) for _ in range(3_072)] for _ in range(20)]
    arrivals = [(i // 64, f"w1-{i}", systems[rng.randrange(20)] + [rng.randrange(50_000) for _ in range(1_024)], 2)
                for i in range(requests)]
    return arrivals, dict(num_blocks=65_536, max_num_seqs=64, max_num_batched_tokens=65_536, max_model_len=8_192)


def w3(requests: int) -> Workload:
    arrivals, config = w1(requests)
    return arrivals, config | dict(num_blocks=131_072, windows=(0, 128))


def decode(requests: int) -> Workload:
    arrivals = [(0, f"d-{i}", [i] * 16 + list(range(496)), 64) for i in range(requests)]
    return arrivals, dict(num_blocks=16_384, max_num_seqs=requests, max_num_batched_tokens=requests * 512,
                          max_model_len=1_024)


def trace(requests: int) -> Workload | None:
    if not TRACE.exists():
        print(f"trace workload skipped: {TRACE} is absent", file=sys.stderr)
        return None
    from hkv_core.replay.trace import prompt_of, read_trace

    arrivals = [(i // 16, f"t-{i}", prompt_of(req, TRACE_BLOCK)[:8_192].tolist(), max(1, req.output_length))
                for i, req in enumerate(read_trace(TRACE, TRACE_BLOCK)[:requests])]
    return arrivals, dict(num_blocks=16_384, max_num_seqs=16, max_num_batched_tokens=16 * 8_192, max_model_len=8_300)


def timed_run(scheduler_cls: type, workload: Workload) -> dict[str, float]:
    from hkv_vllm.drive import build_scheduler, make_request, step

    wanted, config = workload
    started = time.process_time()
    arrivals: dict[int, list[Any]] = {}  # vLLM hashes each prompt's blocks as it builds the Request, either way
    for at, req_id, prompt, out in wanted:
        arrivals.setdefault(at, []).append(make_request(req_id, prompt, max_tokens=out))
    hashing = time.process_time() - started
    scheduler = build_scheduler(scheduler_cls, **config)
    steps = cpu = 0.0
    total = sum(len(v) for v in arrivals.values())
    hits = 0
    for index in range(100_000):
        for request in arrivals.get(index, ()):
            scheduler.add_request(request)
        if index > max(arrivals) and not scheduler.has_unfinished_requests():
            break
        started = time.process_time()
        record = step(scheduler, lambda req_id, pos: pos % 50_000)
        cpu += time.process_time() - started
        steps += 1
        hits += sum(n for _, n in record.cached)
    return {"us_per_step": 1e6 * cpu / steps, "us_per_request": 1e6 * cpu / total, "steps": steps,
            "cached_tokens": hits, "us_per_request_building": 1e6 * hashing / total}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small workloads, one repeat (a smoke run)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    setup_environment()
    from vllm.v1.core.sched.scheduler import Scheduler as Stock

    import hkv_vllm

    scale = 8 if args.quick else 1
    repeats = 1 if args.quick else args.repeats
    workloads: dict[str, Callable[[], Any]] = {"W1": lambda: w1(512 // scale), "W3": lambda: w3(512 // scale),
                                                "decode": lambda: decode(256 // scale),
                                                "trace": lambda: trace(400 // scale)}
    results: dict[str, Any] = {}
    for name, make in workloads.items():
        workload = make()
        if workload is None:
            continue
        runs: dict[str, list[dict[str, float]]] = {"stock": [], "hkv": []}
        for _ in range(repeats):
            for label, cls in (("stock", Stock), ("hkv", hkv_vllm.Scheduler)):
                runs[label].append(timed_run(cls, workload))
        results[name] = summarize(runs)
    report(results, args)
    return 0


def summarize(runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, got in runs.items():
        out[label] = {k: statistics.median(r[k] for r in got) for k in got[0]}
    out["ratio_step"] = out["hkv"]["us_per_step"] / out["stock"]["us_per_step"]
    out["ratio_request"] = out["hkv"]["us_per_request"] / out["stock"]["us_per_request"]
    build = statistics.median([r["us_per_request_building"] for got in runs.values() for r in got])
    out["us_per_request_building"] = build  # building the Request (vLLM's block hashing): paid with either
    out["ratio_with_building"] = ((out["hkv"]["us_per_request"] + build) / (out["stock"]["us_per_request"] + build))
    return out


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    from bench_manager import code_version

    stored = {"commit": code_version("hkv_core", "hkv_vllm"), "repeats": args.repeats, "workloads": results}
    if args.json_out:
        args.json_out.write_text(json.dumps(stored, indent=1) + "\n")
    if args.json:
        print(json.dumps(stored, indent=1))
        return
    print(f"code: {stored['commit']}")
    print(f"{'workload':<8} {'stock us/step':>14} {'hkv us/step':>12} {'hkv/stock':>10} {'stock us/req':>13} "
          f"{'hkv us/req':>11} {'+ building':>11} {'hkv/stock':>10} {'cached tokens stock / hkv':>26}")
    for name, r in results.items():
        s, h = r["stock"], r["hkv"]
        print(f"{name:<8} {s['us_per_step']:>14,.0f} {h['us_per_step']:>12,.0f} {r['ratio_step']:>9.2f}x "
              f"{s['us_per_request']:>13,.0f} {h['us_per_request']:>11,.0f} {r['us_per_request_building']:>11,.0f} "
              f"{r['ratio_with_building']:>9.2f}x {int(s['cached_tokens']):>12,} / {int(h['cached_tokens']):,}")


if __name__ == "__main__":
    raise SystemExit(main())
