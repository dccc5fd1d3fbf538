#!/usr/bin/env python3
"""The README's speed figures, rendered from benchmark results stored in benchmarks/results/.

    python scripts/readme_figures.py record-peers RESULTS.json [MORE.json ...]  # store a peer-harness run
                                          # (W1,W3 or W2); further W1,W3 runs of the same commit add their ratios
    python scripts/readme_figures.py write                      # rewrite the README's figures block
    python scripts/readme_figures.py check                      # exit 1 when the README's block differs

Sources (each records the commit it measured):
- `benchmarks/results/peers_w1w3.json` and `peers_w2.json`: runs of the peer
  harness (`bench_peers.py --workloads W1,W3 --repeats 5` / `--workloads W2`),
  stored by `record-peers` right after the run, with the commit checked out
  (refused when hkv_core has uncommitted changes) and without the per-request
  hit lists;
- `benchmarks/results/bench_manager.json`: `benchmarks/bench_manager.py --json-out`;
- `benchmarks/results/bench_events.json`: `benchmarks/bench_events.py --json-out`;
- `benchmarks/results/hybrid_replay.json`: `benchmarks/bench_hybrid_replay.py --json-out` (hit rates, not
  speed: a block of its own, between the hybrid-replay markers).

The README quotes no benchmark figure outside the block this script writes
(between the two marker lines; the few durations quoted elsewhere - how
long a command took - name the commit they were measured at);
tests/e2e/test_readme_figures.py checks the block.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
BEGIN, END = "<!-- figures:begin (scripts/readme_figures.py write) -->", "<!-- figures:end -->"
HYBRID_BEGIN = "<!-- hybrid-replay:begin (scripts/readme_figures.py write) -->"
HYBRID_END = "<!-- hybrid-replay:end -->"
PEERS_W1W3, PEERS_W2, MANAGER = RESULTS / "peers_w1w3.json", RESULTS / "peers_w2.json", RESULTS / "bench_manager.json"
EVENTS = RESULTS / "bench_events.json"
HYBRID = RESULTS / "hybrid_replay.json"
# The 1M-token prompt's "no slower than before" targets: the peer harness's W2 at 0c572f4 (hkv FULL, V4-Flash), ms.
BEFORE = {"commit": "0c572f4", "hash_s": (23.6, 20.0), "hit_lookup_s": (5.5, 7.5)}
W1_PEERS = (("vllm", "vLLM"), ("vllm-xxhash", "vLLM xxhash"), ("sglang", "SGLang RadixCache"),
            ("sglang-pagealloc", "SGLang page-aligned"))
W3_PEERS = (("vllm-hybrid", "vLLM hybrid"), ("sglang-swa", "SGLang SWARadixCache"))


def commit() -> str:
    """HEAD's short hash; SystemExit when hkv_core has uncommitted changes (the figures would name no commit)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "hkv_core", "benchmarks/peer_driver.py"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    if dirty:
        raise SystemExit("hkv_core has uncommitted changes: commit, run the benchmark again, then record it")
    return head


def record_peers(path: Path, more: list[Path] | None = None) -> Path:
    """Store a harness result file (hit lists dropped, commit added) as peers_w1w3.json or peers_w2.json;
    the W1/W3 ratios of `more` runs (same commit, run right after) go with it as `other_runs`."""
    run = json.loads(path.read_text())
    run["other_runs"] = [json.loads(p.read_text())["ratios"] for p in more or []]
    for rows in (run.get("W1", []), run.get("W3", [])):
        for row in rows:
            row.pop("hits_per_request", None)
    for row in run.get("W2", []):
        row.pop("runs", None)
    run["commit"] = commit()
    target = PEERS_W2 if run.get("W2") and not run.get("W1") else PEERS_W1W3
    RESULTS.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(run, indent=1) + "\n")
    return target


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _us(rows: list[dict[str, Any]], engine: str) -> float:
    return float(next(r["us_per_req"] for r in rows if r["engine"] == engine))


def _verdict(ratio: float) -> str:
    return "yes" if ratio <= 1.0 else "**no**"


def peers_table(run: dict[str, Any]) -> list[str]:
    """W1 and W3: hkv's us per request and its ratio to every peer (median of per-repetition ratios)."""
    ratios = run["ratios"]
    lines = [f"Peer harness, `--workloads W1,W3 --repeats {run['args']['repeats']}` at commit `{run['commit']}` "
             f"(vLLM {run['versions']['vllm']}, SGLang {run['versions']['sglang']}); us per request are medians "
             "of the repetitions, ratios the median of per-repetition ratios (below 1: hkv is faster).", "",
             "| workload | hkv us/request | hkv / peer (peer us/request) | target | met? |",
             "| --- | ---: | --- | --- | --- |"]
    for workload, hkv, peers, cheap, floor in (("W1, FULL (`llama_full`)", "hkv", W1_PEERS, "sglang-pagealloc", "vllm"),
                                               ("W3, V4-Flash vs hybrid peers", "hkv-v4", W3_PEERS, "sglang-swa",
                                                "vllm-hybrid")):
        rows = run[workload[:2]]
        cells = "; ".join(f"{label} **{ratios[f'{hkv}/{peer}']['total']:.2f}x** ({_us(rows, peer):,.0f})"
                          for peer, label in peers)
        best, least = ratios[f"{hkv}/{cheap}"]["total"], ratios[f"{hkv}/{floor}"]["total"]
        lines.append(f"| {workload} | {_us(rows, hkv):,.0f} | {cells} | <= {cheap}; at least < {floor} | "
                     f"<= {cheap}: {_verdict(best)}; < {floor}: {_verdict(least)} |")
    agreement = run.get("hit_agreement_vs_vllm", {})
    agree = bool(agreement) and all(v["differing_requests"] == 0 for v in agreement.values())
    lines += ["", f"Every engine's hit equals vLLM's request by request: {'yes' if agree else '**no**'}."]
    others = run.get("other_runs", [])
    if others:
        def listed(key: str) -> str:
            return ", ".join(f"{r[key]['total']:.2f}x" for r in others)
        lines.append(f"{len(others)} more runs right after, same commit: W1 hkv / vLLM {listed('hkv/vllm')}; "
                     f"W3 hkv V4-Flash / vLLM hybrid {listed('hkv-v4/vllm-hybrid')}.")
    return lines


def w2_table(run: dict[str, Any]) -> list[str]:
    """W2, one 1,048,576-token prompt: hash, second request's match, allocate on a miss (ms), with the targets."""
    rows = {r["engine"]: r for r in run["W2"] if "error" not in r}
    engines = [e for e in ("hkv", "hkv-v4", "sglang", "vllm") if e in rows]
    names = {"hkv": "hkv FULL", "hkv-v4": "hkv V4-Flash", "sglang": "SGLang", "vllm": "vLLM"}
    lines = [f"Peer harness, `--workloads W2` at commit `{run['commit']}` (each engine in a fresh process, "
             "median of its repetitions; ms):", "",
             "| | " + " | ".join(names[e] for e in engines) + " | target (hkv FULL / V4-Flash) | met? |",
             "| --- |" + " ---: |" * len(engines) + " --- | --- |"]
    ours = [e for e in ("hkv", "hkv-v4") if e in rows]
    which = {"hkv": 0, "hkv-v4": 1}  # each engine against its own figure of before
    for key, label in (("hash_s", "hash the prompt"), ("hit_lookup_s", "2nd request: match")):
        before = BEFORE[key]
        cells = " | ".join(f"{rows[e][key] * 1e3:.1f}" for e in engines)
        met = bool(ours) and all(rows[e][key] * 1e3 <= before[which[e]] for e in ours)
        lines.append(f"| {label} | {cells} | no slower than at `{BEFORE['commit']}` ({before[0]} / {before[1]}) | "
                     f"{'yes' if met else '**no**'} |")
    if "sglang" in rows:
        base = rows["sglang"]["alloc_s"]
        cells = " | ".join(f"{rows[e]['alloc_s'] * 1e3:.1f}" for e in engines)
        ratios = " / ".join(f"{rows[e]['alloc_s'] / base:.1f}x" for e in ours)
        met = all(rows[e]["alloc_s"] <= 2 * base for e in ours)
        lines.append(f"| allocate (+ commit for hkv) on a miss | {cells} | within 2x SGLang's allocate ({ratios}) | "
                     f"{'yes' if met else '**no**'} |")
    return lines


def manager_table(report: dict[str, Any]) -> list[str]:
    """bench_manager: us per request on the shared-prefix workload; the 1M-token prompt's figures and targets."""
    shared, long = report["shared_prefix"], report["long_prompt"]
    layouts = [name for name in shared if name in long]
    lines = [f"`benchmarks/bench_manager.py` at commit `{report['config']['code']}` ({report['config']['clock']} "
             f"clock, median of {report['config']['runs']} runs):", "",
             "| layout | us/request (shared prefix) | 1M prompt: allocate + commit, ms | match, ms | "
             "one decode step, us (target < 50) | index metadata, B/block (target < 64) |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name in layouts:
        s, ms, memory = shared[name], long[name]["ms"], long[name]["memory"]
        decode, meta = ms["decode_step_us"], memory["bytes_per_block"]
        lines.append(f"| {name} | {s['us_per_request']:,.0f} | {ms['allocate_commit_ms']:.1f} | {ms['match_ms']:.1f}"
                     f" | {decode:.0f} ({_verdict(decode / 50)}) | {meta:.1f} ({_verdict(meta / 64)}) |")
    share = ", ".join(f"{name} {shared[name]['evicting_request_fraction']:.1%}" for name in layouts)
    lines += ["", f"Requests of the shared-prefix workload whose allocation evicted: {share}."]
    return lines


def events_table(report: dict[str, Any]) -> list[str]:
    """bench_events: what KV cache events cost the request path, against the same workload without them."""
    cells = "; ".join(f"{name}: {us:,.0f} us/request ({report['ratio_to_baseline'][name]:.2f}x)"
                      for name, us in report["us_per_request"].items())
    return [f"`benchmarks/bench_events.py` at commit `{report['commit']}` ({report['layout']}, "
            f"{report['requests']:,} requests, median of {report['runs']} interleaved runs): {cells}."]


def hybrid_table(report: dict[str, Any]) -> list[str]:
    """bench_hybrid_replay: token hit rates of hkv and of vLLM's Mamba prefix caching (both of vLLM's set-ups for
    the model) at equal device bytes."""
    first = report["rows"][0]
    blocks = first["vllm"]["block_tokens"], first["vllm_hopper"]["block_tokens"]
    out = [f"`benchmarks/bench_hybrid_replay.py` at commit `{report['commit']}` ({report['layout']}, recurrent "
           f"state in {report['state_dtype']} on every side); token hit rate, the highest in bold, and the requests "
           "that resumed further with hkv / with that vLLM:", "",
           f"| trace | memory | hkv | vLLM, Triton GDN (block {blocks[0]}) | vLLM, FlashInfer GDN as on H100 / H200 "
           f"(block {blocks[1]}) |", "| --- | ---: | ---: | ---: | ---: |"]
    for row in report["rows"]:
        rates = [row[side]["token_hit_rate"] for side in ("hkv", "vllm", "vllm_hopper")]
        cells = [f"**{rate:.3f}**" if rate == max(rates) else f"{rate:.3f}" for rate in rates]
        for i, side in ((1, "vllm"), (2, "vllm_hopper")):
            compared = row[f"{side}_compared"]
            cells[i] += f" ({compared['hkv_further']:,} / {compared['vllm_further']:,})"
        out.append(f"| {row['trace']} ({row['requests']:,} requests) | {row['memory_gib']:g} GiB | "
                   + " | ".join(cells) + " |")
    out += ["", "Resume granularity: hkv resumes at any block boundary (blocks of 512 tokens here) where it kept a "
            "point - every 16 blocks, at each prompt's last block boundary and where a prompt left the cached "
            f"chain; vLLM at multiples of its block ({blocks[0]} or {blocks[1]} tokens) where it kept a state - "
            "where a prefill chunk of up to 8,192 tokens ended (Triton) or at a checkpoint the kernel exported "
            "from inside the prefill (FlashInfer), at the prompt's last block boundary and at a shared-prefix "
            "junction."]
    return out


def render() -> str:
    parts: list[list[str]] = []
    for path, table in ((PEERS_W1W3, peers_table), (PEERS_W2, w2_table), (MANAGER, manager_table),
                        (EVENTS, events_table)):
        data = _load(path)
        parts.append(table(data) if data is not None else [f"(no results stored in `{path.relative_to(ROOT)}`)"])
    body = "\n\n".join("\n".join(p) for p in parts)
    return f"{BEGIN}\n{body}\n{END}"


def render_hybrid() -> str:
    data = _load(HYBRID)
    body = "\n".join(hybrid_table(data)) if data is not None else f"(no results stored in `{HYBRID.relative_to(ROOT)}`)"
    return f"{HYBRID_BEGIN}\n{body}\n{HYBRID_END}"


def refreshed(text: str) -> str:
    """`text` (the README) with its figures blocks rendered afresh from benchmarks/results/."""
    for begin, end_mark, block in ((BEGIN, END, render), (HYBRID_BEGIN, HYBRID_END, render_hybrid)):
        start, end = text.find(begin), text.find(end_mark)
        if start < 0 or end < start:
            raise SystemExit(f"README.md lacks the figures markers ({begin} ... {end_mark})")
        text = text[:start] + block() + text[end + len(end_mark):]
    return text


def main(argv: list[str]) -> int:
    if argv[:1] == ["record-peers"] and len(argv) >= 2:
        print(f"stored {record_peers(Path(argv[1]), [Path(p) for p in argv[2:]]).relative_to(ROOT)}")
        return 0
    if argv not in (["write"], ["check"]):
        print(__doc__, file=sys.stderr)
        return 2
    text = README.read_text()
    fresh = refreshed(text)
    if argv == ["write"]:
        README.write_text(fresh)
        return 0
    if fresh != text:
        print("README.md's figures differ from benchmarks/results/: run scripts/readme_figures.py write",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
