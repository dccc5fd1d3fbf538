"""`hkv check`: bounded exhaustive model check of the lifecycle spec, then of the real CacheManager."""

from __future__ import annotations

from typing import Any

import attrs
import click
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from hkv_cli.errors import FAILED, OK, TRUNCATED
from hkv_cli.output import console, out, plain, print_json
from hkv_core.checker import CheckConfig, CheckResult, check
from hkv_core.checker import impl as impl_bound
from hkv_core.checker import world as bound
from hkv_core.checker.impl import ImplCheckConfig, ImplCheckResult, check_implementation, seeded_manager
from hkv_core.spec import load_lifecycle
from hkv_core.spec.records import LifecycleSpec

_CHECK, _IMPL = CheckConfig(), ImplCheckConfig()  # the defaults the options show
# The layouts the implementation check runs on: tiny_csa has every kind of an attention model (compressed KV,
# compressor tails, the window, indexer keys and tails), tiny_linear a hybrid's recurrent state beside full KV;
# tiny_csa-shared is tiny_csa with its pools drawing pages from one shared block space of 20 pages
# (ManagerConfig.shared_pages, as vLLM's groups share one block pool).
IMPL_SEARCHES: dict[str, dict[str, Any]] = {
    "tiny_csa": {"layout": "tiny_csa"}, "tiny_linear": {"layout": "tiny_linear"},
    "tiny_csa-shared": {"layout": "tiny_csa", "shared_pages": 20}}
IMPL_LAYOUTS = tuple(IMPL_SEARCHES)


def exit_status(result: CheckResult, impls: list[ImplCheckResult]) -> int:
    """1 when an invariant is violated, else 3 when a state cap stopped any search, else 0."""
    if result.violations or any(impl.violations for impl in impls):
        return FAILED
    if result.truncated or any(impl.truncated for impl in impls):
        return TRUNCATED
    return OK


@click.command("check", epilog="Exit statuses: 0 every state within the bound explored, no violation; "
                               "1 an invariant is violated (the shortest trace is printed); 2 bad input "
                               "(an option out of range, a malformed --spec); 3 a state cap was reached "
                               "before the bound was explored and no violation was found: TRUNCATED, no "
                               "verdict (lower the bound).")
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False), default=None,
              help="Lifecycle spec to check (default: the shipped specs/lifecycle.toml).  Both checks use it: "
                   "the abstract world, and the real CacheManager, which runs on the tables compiled from it.")
@click.option("--prefixes", default=_CHECK.prefixes, show_default=True,
              type=click.IntRange(1, bound.MAX_PREFIXES),
              help="Prefixes; each is one segment per kind of the spec: the device objects (5 kinds), "
                   "its tier load, its block (chained to the previous prefix's) and its resume point.")
@click.option("--seeded", "seeded_prefixes", default=_CHECK.seeded_prefixes, show_default=True,
              type=click.IntRange(0, bound.MAX_PREFIXES),
              help="Prefixes staged and published by request 0 in the seed worlds (at most --prefixes).")
@click.option("--requests", default=_CHECK.requests, show_default=True,
              type=click.IntRange(1, bound.MAX_REQUESTS), help="Concurrent requests.")
@click.option("--slots", "device_slots", default=_CHECK.device_slots, show_default=True,
              type=click.IntRange(1, bound.MAX_DEVICE_SLOTS), help="Device slots shared by all device segments.")
@click.option("--depth", "max_depth", default=_CHECK.max_depth, show_default=True,
              type=click.IntRange(0, bound.MAX_DEPTH), help="Events explored beyond each seed world.")
@click.option("--max-states", default=bound.MAX_STATES, show_default=True,
              type=click.IntRange(1, bound.MAX_STATES),
              help="State cap of the abstract check (about 0.9 KB and 45 us a state): at the cap the search "
                   "stops growing and the result is TRUNCATED (exit 3).")
@click.option("--impl-depth", default=_IMPL.max_depth, show_default=True,
              type=click.IntRange(0, impl_bound.MAX_DEPTH),
              help=f"API calls explored on the real CacheManager ({_IMPL.layout}, {_IMPL.block_tokens}-token "
                   f"blocks, {_IMPL.pool_pages} pages a pool, {_IMPL.max_requests} requests, from an index "
                   "holding one computed prompt; 0 skips the implementation check).")
@click.option("--impl-max-states", default=impl_bound.MAX_STATES, show_default=True,
              type=click.IntRange(1, impl_bound.MAX_STATES),
              help="State cap of the implementation check (about 30 KB and 2 ms a state): at the cap the "
                   "search stops growing and the result is TRUNCATED (exit 3).")
@click.option("--impl-layout", "impl_layouts", multiple=True, default=IMPL_LAYOUTS, show_default=True,
              type=click.Choice(IMPL_LAYOUTS),
              help="Layouts the implementation check runs on, one search each (repeat the option).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def check_command(spec_path: str | None, prefixes: int, seeded_prefixes: int, requests: int, device_slots: int,
                  max_depth: int, max_states: int, impl_depth: int, impl_max_states: int,
                  impl_layouts: tuple[str, ...], as_json: bool) -> None:
    """Explore every reachable state within the bound; evaluate every invariant in each.

    Two checks: the abstract lifecycle spec (every event on every segment:
    device objects, tier loads, blocks and resume points), and the real
    CacheManager on a tiny layout (every sequence of public API calls, each on
    a clone).
    """
    spec = load_lifecycle(spec_path)  # a bad file is a SpecError naming it (hkv_core.spec.toml_fields.read_toml)
    config = CheckConfig(prefixes=prefixes, requests=requests, device_slots=device_slots, max_depth=max_depth,
                         seeded_prefixes=min(seeded_prefixes, prefixes), max_states=max_states)
    impl_configs = [ImplCheckConfig(**IMPL_SEARCHES[name], max_depth=impl_depth, max_states=impl_max_states)
                    for name in dict.fromkeys(impl_layouts)] if impl_depth > 0 else []
    for impl_config in impl_configs:
        seeded_manager(impl_config, spec)  # a spec the manager cannot run on is refused before the long search
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=True, disable=as_json) as bar:
        task = bar.add_task("exploring: 0 states", total=None)
        result = check(spec, config,
                       progress=lambda n: bar.update(task, description=f"exploring: {n:,} states"))
        impls = [_impl_search(bar, impl_config, spec) for impl_config in impl_configs]
    status = exit_status(result, impls)
    if as_json:
        payload = result_dict(result, config)
        found = [impl_dict(impl, impl_config) for impl, impl_config in zip(impls, impl_configs, strict=True)]
        payload["implementation"] = found[0] if found else None  # the first layout's (tiny_csa by default)
        payload["implementations"] = found
        payload["spec"] = spec.source
        payload["status"] = {OK: "ok", FAILED: "violations", TRUNCATED: "truncated"}[status]
        payload["exit_status"] = status
        print_json(payload)
    else:
        out.print(f"spec: {plain(spec.source)} (both checks)" if impls else f"spec: {plain(spec.source)}",
                  highlight=False)
        _print_table(result, config)
        for impl, impl_config in zip(impls, impl_configs, strict=True):
            _print_impl(impl, impl_config)
        if status == TRUNCATED:
            out.print("[yellow]TRUNCATED[/yellow]: a state cap stopped the search before the bound was explored; "
                      "no violation in the states explored, but no verdict (exit 3). Lower --depth, --prefixes, "
                      "--requests or --impl-depth.", highlight=False)
    raise SystemExit(status)


def _impl_search(bar: Progress, config: ImplCheckConfig, spec: LifecycleSpec) -> ImplCheckResult:
    task = bar.add_task(f"manager on {_where(config)}: 0 states", total=None)
    return check_implementation(
        config, spec=spec,
        progress=lambda n: bar.update(task, description=f"manager on {_where(config)}: {n:,} states"))


def _where(config: ImplCheckConfig) -> str:
    """The search's layout, and its shared block space if any."""
    shared = f", one shared space of {config.shared_pages} pages" if config.shared_pages else ""
    return f"{config.layout}{shared}"


def impl_dict(result: ImplCheckResult, config: ImplCheckConfig) -> dict[str, Any]:
    return {"states_explored": result.states_explored, "calls_explored": result.calls_explored,
            "failed_calls_unchanged": result.failed_calls, "invariants_checked": result.invariants_checked,
            "violations": [{"invariant": name, "trace": list(trace)} for name, trace in result.violations],
            "truncated": result.truncated,
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


def _search(truncated: bool, cap: int) -> str:
    """The table's verdict on the search itself: did it cover the bound?"""
    return f"[yellow]TRUNCATED[/yellow] at the state cap ({cap:,})" if truncated else "complete (whole bound)"


def _print_impl(result: ImplCheckResult, config: ImplCheckConfig) -> None:
    table = Table(title=f"hkv check: CacheManager on {plain(_where(config))} (every API call sequence)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("search", _search(result.truncated, config.max_states))
    for name, value in [("states explored", result.states_explored), ("calls explored", result.calls_explored),
                        ("failed calls (state unchanged)", result.failed_calls),
                        ("invariant evaluations", result.invariants_checked),
                        ("violations", len(result.violations)), ("seconds", f"{result.seconds:.1f}"),
                        ("lifecycle steps taken", len(result.transitions_taken))]:
        table.add_row(name, f"{value:,}" if isinstance(value, int) else str(value))
    out.print(table)
    if result.transitions_missed:
        out.print("steps the manager can take on this layout that no explored call took: "
                  + ", ".join(plain(t) for t in result.transitions_missed), highlight=False)
    for name, trace in result.violations:
        out.print(f"[red]VIOLATION {plain(name)}[/red]", highlight=False)
        for step, label in enumerate(trace, 1):
            out.print(f"  {step:3d}. {plain(label)}", highlight=False)


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
        "events_fired": list(result.events_fired),
    }


def _print_table(result: CheckResult, config: CheckConfig) -> None:
    table = Table(title="hkv check: lifecycle spec")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("search", _search(result.truncated, config.max_states))
    for name, value in [("states explored", result.states_explored),
                        ("transitions explored", result.transitions_explored),
                        ("invariant evaluations", result.invariants_checked),
                        ("invariants", len(result.invariant_names)),
                        ("events fired", len(result.events_fired)),
                        ("violations", len(result.violations)),
                        ("seconds", f"{result.seconds:.1f}")]:
        table.add_row(name, f"{value:,}" if isinstance(value, int) else str(value))
    out.print(table)
    for v in result.violations:
        out.print(f"[red]VIOLATION {plain(v.invariant)}[/red]: {plain(v.message)}", highlight=False)
        for step, label in enumerate(v.trace, 1):
            out.print(f"  {step:3d}. {plain(label)}", highlight=False)
