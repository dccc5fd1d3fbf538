"""`hkv demo --remote`: two instances in two processes share prefixes through a local Mooncake master."""

from __future__ import annotations

from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hkv_cli.errors import FAILED, OK
from hkv_cli.output import console, out, plain, print_json
from hkv_exec_ref.demo import WorkloadConfig
from hkv_exec_ref.demo.remote_demo import INSTANCES, RemoteDemoReport, run_remote_demo
from hkv_exec_ref.engine.results import TIER_NAMES

COUNTS = {"published": "records this instance put into the shared store",
          "loaded": "records fetched from the store and checked (served up to the deepest point that arrived whole)",
          "dropped_bad": "fetched records that failed a check (removed, never served)",
          "unavailable": "times the store failed or was late (then skipped for retry_s)"}


def run(cfg: WorkloadConfig, folder: Path, as_json: bool) -> None:
    """Serve the workload on two instances sharing a master; print the figures; exit 0 / 1 as `hkv demo`."""
    with Progress(TextColumn("serving on 2 instances"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=as_json) as bar:
        task = bar.add_task("serving", total=cfg.requests)
        report = run_remote_demo(cfg, progress=lambda done: bar.update(task, completed=done), log_dir=folder)
    if as_json:
        print_json({**report.to_dict(), "logs": str(folder)})
    else:
        _print(report, folder)
    raise SystemExit(OK if report.ok else FAILED)


def _print(report: RemoteDemoReport, folder: Path) -> None:
    table = Table(title=f"hkv demo --remote: two instances share one Mooncake master ({plain(report.master)})")
    table.add_column("measure")
    for name in INSTANCES:
        table.add_column(f"instance {name}", justify="right")
    table.add_column("meaning", style="dim")
    each = report.per_instance
    rows = [("requests", "requests", "every other request of the workload (round-robin routing)"),
            ("prompt tokens", "prompt_tokens", "")]
    rows += [(f"  served from {tier} (tokens)", f"from_{tier}", meaning) for tier, meaning in zip(
        TIER_NAMES, ("its own device pools", "its host arena", "its disk", "the shared store: computed by "
                     "either instance, published, fetched and checked"), strict=True) if tier in ("device", "remote")]
    for label, key, meaning in rows:
        table.add_row(plain(label), *(f"{each[n].get(key, 0):,}" for n in INSTANCES), plain(meaning))
    for key, meaning in COUNTS.items():
        table.add_row(f"  store: {key}", *(f"{report.remote_counts[n].get(key, 0):,}" for n in INSTANCES),
                      plain(meaning))
    table.add_row("exact match with recomputation", *(f"{each[n].get('exact', 0):,}/{each[n].get('requests', 0):,}"
                                                     for n in INSTANCES), "checked in each instance's process")
    out.print(table)
    if report.ok:
        out.print(f"[green]every response equals recomputation ({report.seconds:.1f} s)[/green]")
    else:
        out.print(f"[red]{len(report.mismatches):,} responses differ from recomputation: requests "
                  f"{plain(list(report.mismatches))}[/red]", highlight=False)
    out.print(f"logs: {plain(folder)}", highlight=False)
