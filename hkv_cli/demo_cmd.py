"""`hkv demo`: the main job - a built-in workload on tiny V4 served through the cache.

Multi-turn chats and agent sessions sharing system prompts (a Mooncake-format trace,
written next to the chart) are served by the reference engine: prefix hits through
the CacheManager, state through the RefExecutor.  Every response is checked against
a full recomputation; the exit status is 1 if any differs.  `--fault NAME` switches
on one of tiny V4's fault switches (every resume from the pools is broken), which
must make the check fail: it proves the check can.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hkv_cli.output import console, out, print_json
from hkv_exec_ref.demo import DemoReport, WorkloadConfig, generate_trace, run_demo
from hkv_exec_ref.demo.chart import write_chart
from hkv_exec_ref.demo.workload import write_trace
from hkv_exec_ref.tiny_v4 import Fault

FAULTS = {f.name.lower(): f for f in Fault if f.name and f is not Fault.NONE}
TRACE_NAME = "demo_trace.jsonl"


@click.command("demo")
@click.option("--requests", default=WorkloadConfig().requests, show_default=True, type=click.IntRange(1),
              help="Requests in the built-in workload.")
@click.option("--seed", default=0, show_default=True, help="Workload, model and block-key seed.")
@click.option("--out", "out_dir", default="out", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the chart (demo_hits.png) and the trace (demo_trace.jsonl).")
@click.option("--fault", type=click.Choice(sorted(FAULTS)), default=None,
              help="Testing: break every resume from the pools this way; the check must then fail (exit 1).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def demo_command(requests: int, seed: int, out_dir: str, fault: str | None, as_json: bool) -> None:
    """Serve a multi-turn and agentic workload on tiny V4 through the cache; check every output.

    Prints requests, tokens served, tokens from cache per object kind, hit
    validation outcomes per layer and reason, pages moved and the exact-match
    count; writes a PNG of the cache hit length per request (needs matplotlib:
    pip install 'hkv[plot]').  Exits 1 if any served output differs from
    recomputation.
    """
    cfg = WorkloadConfig(requests=requests, seed=seed)
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    write_trace(generate_trace(cfg), folder / TRACE_NAME)
    with Progress(TextColumn("serving"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=as_json) as bar:
        task = bar.add_task("serving", total=requests)
        report = run_demo(cfg, fault=FAULTS[fault] if fault else Fault.NONE,
                          progress=lambda done: bar.update(task, completed=done))
    chart = write_chart(report, folder)
    if as_json:
        print_json({**report.to_dict(), "trace": str(folder / TRACE_NAME), "chart": str(chart) if chart else None})
    else:
        _print(report, chart, folder / TRACE_NAME)
    raise SystemExit(0 if report.ok else 1)


def _figures(report: DemoReport) -> list[tuple[str, Any]]:
    share = report.cached_tokens / max(1, report.prompt_tokens)
    rows: list[tuple[str, Any]] = [
        ("requests", report.requests),
        ("tokens served (prompt + generated)", report.tokens_served),
        ("prompt tokens from cache", f"{report.cached_tokens:,} ({share:.0%})"),
        ("tokens computed (prefill + decode steps)", report.computed_tokens),
    ]
    rows += [(f"  from cache: {kind}", n) for kind, n in report.cached_by_kind.items()]
    rows += [("pages moved (copy / load ops)", report.pages_moved), ("entries copied", report.entries_copied),
             ("entries written by forward passes", report.entries_written),
             ("evicted blocks / resume points", f"{report.evicted_blocks} / {report.evicted_points}"),
             ("exact match with recomputation", f"{report.exact_matches}/{report.requests}"),
             ("seconds", f"{report.seconds:.1f}")]
    return rows


def _print(report: DemoReport, chart: Path | None, trace: Path) -> None:
    fault = "" if report.fault == "NONE" else f", fault {report.fault}"
    table = Table(title=f"hkv demo: tiny V4 served through the cache{fault}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in _figures(report):
        table.add_row(name, f"{value:,}" if isinstance(value, int) else str(value))
    out.print(table)
    reasons = Table(title="hit validation outcomes (requests)")
    for column in ("layer", "reason", "requests"):
        reasons.add_column(column, justify="right" if column == "requests" else "left")
    for layer, codes in report.validation.items():
        for code, n in codes.items():
            reasons.add_row(layer, code, f"{n:,}")
    out.print(reasons)
    verdict = "[green]every response equals recomputation[/green]" if report.ok else (
        f"[red]{len(report.mismatches)} responses differ from recomputation: requests "
        f"{list(report.mismatches)[:10]}[/red]")
    out.print(verdict)
    out.print(f"trace: {trace}")
    out.print(f"chart: {chart}" if chart else "chart skipped: matplotlib is not installed (pip install 'hkv[plot]')")
