"""How far HF DeepSeek-V4's chunked (served) outputs are from its one-shot prefill (docs/hf.md).

For each `index_topk` and context length, a tiny random HF DeepSeek-V4 serves one prompt through hkv (HfEngine:
calls cut at every retained block, state from the pools each call) and runs it again in one call with HF's own
cache.  Printed per configuration: the largest |logit difference| over the prompt, the share of positions
whose logits differ at all, and the share whose greedy token differs; then the same with the batch-invariant
indexer scoring installed (hkv_exec_ref.hf.invariant).  Served == HF over the same calls is checked on every
run (it is the test suite's claim; this script measures the other gap).

    python benchmarks/bench_hf_gap.py [--topk 2 4 16 128] [--tokens 64 128 256 512] [--json-out PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_manager import code_version  # this script's folder is on sys.path when it runs
from rich.console import Console
from rich.table import Table

from hkv_exec_ref.hf import HfEngine
from hkv_exec_ref.hf.invariant import install_batch_invariant_indexer


def measure(topk: int, tokens: int, invariant: bool) -> dict[str, Any]:
    engine = HfEngine.tiny("deepseek_v4", 0, index_topk=topk, retain_every_blocks=1)
    if invariant:
        install_batch_invariant_indexer(engine.model.hf)
    prompt = np.random.default_rng(1).integers(0, engine.config.vocab, tokens)
    began = time.perf_counter()
    served = engine.generate(prompt, 1)
    assert engine.matches_recompute(prompt, served), "served != HF over the same calls"
    one_shot = engine.recompute(prompt, 1)
    diff = np.abs(served.prompt_logits - one_shot.prompt_logits)
    flips = np.argmax(served.prompt_logits, 1) != np.argmax(one_shot.prompt_logits, 1)
    return {"index_topk": topk, "tokens": tokens, "entries": tokens // 4, "invariant_indexer": invariant,
            "max_abs_diff": float(diff.max()), "positions_differing": float(np.mean(diff.max(1) > 0)),
            "greedy_tokens_differing": float(np.mean(flips)), "calls": len(served.boundaries),
            "seconds": round(time.perf_counter() - began, 2)}


def table(rows: list[dict[str, Any]], commit: str) -> Table:
    out = Table(title=f"HF DeepSeek-V4 (tiny, random): served (chunked at hkv's blocks) vs one-shot prefill, "
                      f"at {commit}")
    for name in ("indexer", "index_topk", "tokens", "entries", "max |diff|", "positions differing",
                 "greedy tokens differing"):
        out.add_column(name, justify="right")
    for r in rows:
        out.add_row("batch-invariant" if r["invariant_indexer"] else "HF", str(r["index_topk"]), str(r["tokens"]),
                    str(r["entries"]), f"{r['max_abs_diff']:.2e}", f"{r['positions_differing']:.0%}",
                    f"{r['greedy_tokens_differing']:.1%}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topk", type=int, nargs="+", default=[2, 4, 16, 128])
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    commit = code_version("hkv_core", "hkv_exec_ref")
    rows = [measure(k, n, inv) for inv in (False, True) for k in args.topk for n in args.tokens]
    Console().print(table(rows, commit or "?"))
    if args.json_out:
        args.json_out.write_text(json.dumps({"commit": commit, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
