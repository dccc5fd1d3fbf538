"""`hkv check`: bounded exhaustive model check of the lifecycle spec, then of the real CacheManager."""

from __future__ import annotations

from typing import Any

import attrs
import click
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from hkv_cli.output import console, out, print_json
from hkv_core.checker import CheckConfig, CheckResult, check
from hkv_core.checker.impl import ImplCheckConfig, ImplCheckResult, check_implementation
from hkv_core.spec import load_lifecycle


@click.command("check")
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False), default=None,
              help="Lifecycle spec to check (default: the shipped specs/lifecycle.toml).")
@click.option("--prefixes", default=CheckConfig().prefixes, show_default=True, type=click.IntRange(1, 4),
              help="Prefixes; each is one segment per kind of the spec: the device objects (4 kinds), "
                   "its disk record, its block (chained to the previous prefix's) and its resume point.")
@click.option("--seeded", "seeded_prefixes", default=CheckConfig().seeded_prefixes, show_default=True,
              type=click.IntRange(0, 4),
              help="Prefixes staged and published by request 0 in the seed worlds (at most --prefixes).")
@click.option("--requests", default=CheckConfig().requests, show_default=True, type=click.IntRange(1, 4),
              help="Concurrent requests.")
@click.option("--slots", "device_slots", default=CheckConfig().device_slots, show_default=True,
              type=click.IntRange(1, 30), help="Device slots shared by all device segments.")
@click.option("--depth", "max_depth", default=CheckConfig().max_depth, show_default=True, type=click.IntRange(0),
              help="Events explored beyond each seed world.")
@click.option("--impl-depth", default=ImplCheckConfig().max_depth, show_default=True, type=click.IntRange(0),
              help=f"API calls explored on the real CacheManager ({ImplCheckConfig().layout}, "
                   f"{ImplCheckConfig().block_tokens}-token blocks, {ImplCheckConfig().pool_pages} pages a pool, "
                   f"{ImplCheckConfig().max_requests} requests, from an index holding one computed prompt; "
                   "0 skips the implementation check).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def check_command(spec_path: str | None, prefixes: int, seeded_prefixes: int, requests: int, device_slots: int,
                  max_depth: int, impl_depth: int, as_json: bool) -> None:
    """Explore every reachable state within the bound; evaluate every invariant in each.

    Two checks: the abstract lifecycle spec (every event on every segment:
    device objects, disk records, blocks and resume points), and the real
    CacheManager on a tiny layout (every sequence of public API calls, each on
    a clone).  Exits 1 when an invariant is violated (the shortest trace is
    printed).
    """
    spec = load_lifecycle(spec_path)
    config = CheckConfig(prefixes=prefixes, requests=requests, device_slots=device_slots,
                         max_depth=max_depth, seeded_prefixes=min(seeded_prefixes, prefixes))
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=True, disable=as_json) as bar:
        task = bar.add_task("exploring: 0 states", total=None)
        result = check(spec, config,
                       progress=lambda n: bar.update(task, description=f"exploring: {n:,} states"))
        impl = None
        impl_config = ImplCheckConfig(max_depth=impl_depth)
        if impl_depth > 0:
            task2 = bar.add_task("manager: 0 states", total=None)
            impl = check_implementation(
                impl_config, progress=lambda n: bar.update(task2, description=f"manager: {n:,} states"))
    payload = result_dict(result, config)
    payload["implementation"] = impl_dict(impl, impl_config) if impl else None
    if as_json:
        print_json(payload)
    else:
        _print_table(result)
        if impl:
            _print_impl(impl, impl_config)
    raise SystemExit(1 if result.violations or (impl and impl.violations) else 0)


def impl_dict(result: ImplCheckResult, config: ImplCheckConfig) -> dict[str, Any]:
    return {"states_explored": result.states_explored, "calls_explored": result.calls_explored,
            "failed_calls_unchanged": result.failed_calls, "invariants_checked": result.invariants_checked,
            "violations": [{"invariant": name, "trace": list(trace)} for name, trace in result.violations],
            "seconds": round(result.seconds, 3), "bound": _plain(attrs.asdict(config)),
            "transitions_taken": list(result.transitions_taken),
            "transitions_missed": list(result.transitions_missed)}


def _plain(value: Any) -> Any:
    """JSON-ready: tuples as lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _print_impl(result: ImplCheckResult, config: ImplCheckConfig) -> None:
    table = Table(title=f"hkv check: CacheManager on {config.layout} (every API call sequence)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in [("states explored", result.states_explored), ("calls explored", result.calls_explored),
                        ("failed calls (state unchanged)", result.failed_calls),
                        ("invariant evaluations", result.invariants_checked),
                        ("violations", len(result.violations)), ("seconds", f"{result.seconds:.1f}"),
                        ("lifecycle steps taken", len(result.transitions_taken))]:
        table.add_row(name, f"{value:,}" if isinstance(value, int) else str(value))
    out.print(table)
    if result.transitions_missed:
        out.print("steps the manager can take on this layout that no explored call took: "
                  + ", ".join(result.transitions_missed))
    for name, trace in result.violations:
        out.print(f"[red]VIOLATION {name}[/red]")
        for step, label in enumerate(trace, 1):
            out.print(f"  {step:3d}. {label}")


def result_dict(result: CheckResult, config: CheckConfig) -> dict[str, Any]:
    return {
        "states_explored": result.states_explored,
        "transitions_explored": result.transitions_explored,
        "invariants_checked": result.invariants_checked,
        "invariants": list(result.invariant_names),
        "violations": [attrs.asdict(v) for v in result.violations],
        "truncated": result.truncated,
        "seconds": round(result.seconds, 3),
        "bound": attrs.asdict(config),
    }


def _print_table(result: CheckResult) -> None:
    table = Table(title="hkv check: lifecycle spec")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in [("states explored", result.states_explored),
                        ("transitions explored", result.transitions_explored),
                        ("invariant evaluations", result.invariants_checked),
                        ("invariants", len(result.invariant_names)),
                        ("violations", len(result.violations)),
                        ("seconds", f"{result.seconds:.1f}")]:
        table.add_row(name, f"{value:,}" if isinstance(value, int) else str(value))
    out.print(table)
    for v in result.violations:
        out.print(f"[red]VIOLATION {v.invariant}[/red]: {v.message}")
        for step, label in enumerate(v.trace, 1):
            out.print(f"  {step:3d}. {label}")
