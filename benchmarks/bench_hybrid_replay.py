"""Token hit rates of hkv and of vLLM's Mamba prefix caching on a linear-attention hybrid, same traces, same bytes.

    V=${TMPDIR:-/tmp}/hkv-peers-venv/bin/python   # the peer harness's environment (below)
    $V benchmarks/bench_hybrid_replay.py --json-out RESULTS.json
    $V benchmarks/bench_hybrid_replay.py --requests 300 --memory-gib 32      # a smoke run, under a minute

It runs in the environment the peer harness's `setup_env.sh` builds (the
harness is kept outside this repository): vLLM 0.33.0 without its
dependencies, CPU torch, and this checkout installed editable.

Both traces (the shared Mooncake trace, read from ../shared/traces and
skipped with a message when absent, and the session trace of
hkv_core/replay/synthetic.py, seed 0) are served one request at a time,
whole, in timestamp order, by:

- hkv: `hkv_core.replay.replay` on the layout (default Qwen3-Next-80B, its
  recurrent state in bf16 as vLLM keeps it), its pools sized from the
  memory budget (hkv_core/replay/budget.py), LRU;
- vLLM: its Scheduler and KVCacheManager with `mamba_cache_mode="align"`
  over the same layers, the same bytes per token and per state, the budget
  turned into blocks by vLLM's own planner (benchmarks/peer_vllm_mamba.py),
  in the two set-ups vLLM picks for the model: with the Triton (FLA) GDN
  prefill kernel (544-token blocks; a state kept where a prefill chunk ends)
  and, as on an H100 / H200, with FlashInfer's GDN prefill kernel (576-token
  blocks; states taken from inside a prefill, so the chunks are not cut).

Both see the same token ids (the trace's blocks of 512 tokens, made into
tokens by `hkv_core.replay.trace.prompt_of`).  A request that cannot fit
even an emptied cache is counted as uncached on either side (vLLM's then
hits 0, hkv's keeps the hit it computed the rest after); none of the stored
run was.  Printed per trace and
budget: each engine's token hit rate, the requests where one resumed
further than the other, and each engine's device bytes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
TRACE_BLOCK = 512  # tokens per hash id in both traces
GIB = 1 << 30
BUDGETS_GIB = (8.0, 32.0, 128.0, 1024.0)
VLLM_SETUPS = {"vllm": False, "vllm_hopper": True}  # FlashInfer's GDN checkpoints off / on


def traces(limit: int | None) -> dict[str, list[Any]]:
    """Both traces, each cut to its first `limit` requests."""
    from hkv_core.replay import read_trace
    from hkv_core.replay.synthetic import SessionTraceConfig, session_trace

    out: dict[str, list[Any]] = {}
    if MOONCAKE.exists():
        out["mooncake"] = read_trace(MOONCAKE, TRACE_BLOCK)[:limit]
    else:
        print(f"skipping the Mooncake trace: {MOONCAKE} is absent", file=sys.stderr)
    out["sessions"] = session_trace(SessionTraceConfig(), 0)[:limit]
    return out


def run_hkv(requests: list[Any], config: Any) -> dict[str, Any]:
    from hkv_core.replay import replay

    began = time.perf_counter()
    r = replay(requests, config)
    return {"token_hit_rate": r.token_hit_rate, "hits": list(r.hits), "uncached_requests": r.uncached_requests,
            "device_bytes": r.device_bytes, "state_share": round(r.state_share, 4),
            "seconds": round(time.perf_counter() - began, 1)}


def run_vllm(requests: list[Any], layout: Any, memory_bytes: int, checkpoints: bool) -> dict[str, Any]:
    from peer_vllm_mamba import VllmMambaEngine

    from hkv_core.replay.trace import prompt_of

    began = time.perf_counter()
    engine = VllmMambaEngine(layout, memory_bytes, max(r.input_length for r in requests) + 1,
                             checkpoints=checkpoints)
    hits, uncached = [], 0
    for done, request in enumerate(requests, 1):
        hit = engine.serve(prompt_of(request, TRACE_BLOCK).tolist())
        uncached += hit is None
        hits.append(hit or 0)
        if done % 500 == 0:
            print(f"  vllm: {done:,} of {len(requests):,} requests", file=sys.stderr, flush=True)
    return {"token_hit_rate": sum(hits) / sum(r.input_length for r in requests), "hits": hits,
            "uncached_requests": uncached, "device_bytes": engine.device_bytes,
            "block_tokens": engine.block_tokens, "num_blocks": engine.kv_config.num_blocks,
            "groups": engine.groups, "seconds": round(time.perf_counter() - began, 1)}


def compare(hkv: dict[str, Any], vllm: dict[str, Any]) -> dict[str, int]:
    """Requests where one engine resumed further than the other."""
    pairs = list(zip(hkv["hits"], vllm["hits"], strict=True))
    return {"hkv_further": sum(a > b for a, b in pairs), "vllm_further": sum(b > a for a, b in pairs),
            "equal": sum(a == b for a, b in pairs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", default="qwen3_next_80b")
    parser.add_argument("--state-dtype", default="bfloat16", help="the recurrent state's dtype, both engines")
    parser.add_argument("--memory-gib", type=float, nargs="+", default=list(BUDGETS_GIB))
    parser.add_argument("--requests", type=int, default=None, help="only each trace's first N requests")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    from hkv_core.replay import ReplayConfig
    from hkv_core.replay.run import layout_of

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    rows = []
    for name, requests in traces(args.requests).items():
        for gib in args.memory_gib:
            config = ReplayConfig(layout=args.layout, block_tokens=TRACE_BLOCK, memory_bytes=int(gib * GIB),
                                  state_dtype=args.state_dtype)
            print(f"{name}, {gib:g} GiB ...", file=sys.stderr, flush=True)
            hkv = run_hkv(requests, config)
            row: dict[str, Any] = {"trace": name, "requests": len(requests), "memory_gib": gib, "hkv": hkv}
            for side, checkpoints in VLLM_SETUPS.items():
                vllm = row[side] = run_vllm(requests, layout_of(config), int(gib * GIB), checkpoints)
                row[f"{side}_compared"] = compared = compare(hkv, vllm)
                print(f"{name:9} {gib:7g} GiB  hkv {hkv['token_hit_rate']:.4f}  {side} {vllm['token_hit_rate']:.4f} "
                      f"(further: hkv {compared['hkv_further']:,}, {side} {compared['vllm_further']:,} requests; "
                      f"uncached {hkv['uncached_requests']} / {vllm['uncached_requests']}; "
                      f"{hkv['device_bytes'] / GIB:.2f} / {vllm['device_bytes'] / GIB:.2f} GiB; "
                      f"{hkv['seconds']} / {vllm['seconds']} s)", flush=True)
            rows.append(row)
    if args.json_out:
        for row in rows:
            for side in ("hkv", *VLLM_SETUPS):
                del row[side]["hits"]
        args.json_out.write_text(json.dumps({"commit": commit, "layout": args.layout, "state_dtype": args.state_dtype,
                                             "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.json_out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
