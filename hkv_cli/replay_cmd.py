"""`hkv replay`: a Mooncake-format trace through the CacheManager's metadata path; hit rates per capacity.

One capacity (`--capacity-tokens N`, or `inf`; or `--memory-gib G`, a device
budget in bytes split between KV pages and a hybrid's state snapshots)
prints one result; `--sweep`
replays at 1k, 3k, 10k and 30k blocks and unbounded, prints a table and
writes `replay_sweep.png` (hit rate against capacity, one line per policy;
needs matplotlib).  docs/replay.md says how hits are counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hkv_cli.charts import line_chart
from hkv_cli.cluster_out import cluster_configs, cluster_results, print_cluster, write_cluster_chart
from hkv_cli.errors import OK, writable_folder
from hkv_cli.output import console, out, plain, print_json
from hkv_core.layout import preset_names
from hkv_core.manager.config import DEFAULT_RETAIN_EVERY_BLOCKS
from hkv_core.manager.config_bounds import MAX_REQUEST_TOKENS, MAX_RETAIN_EVERY_BLOCKS
from hkv_core.replay import POLICIES, ReplayConfig, ReplayResult, TraceRequest, read_trace, replay
from hkv_core.replay.cluster import ROUTERS, ClusterConfig
from hkv_exec_ref.demo.chart import plotting_available

SWEEP_BLOCKS = (1_000, 3_000, 10_000, 30_000, None)  # None: unbounded
CHART_NAME = "replay_sweep.png"
MAX_CAPACITY_TOKENS = 1 << 40
MAX_INSTANCES = 64


def capacity(value: str) -> int | None:
    """`inf` or a token count."""
    if value.strip().lower() in ("inf", "infinite", "unbounded"):
        return None
    try:
        tokens = int(value.replace(",", "").replace("_", ""))
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither a token count nor 'inf'") from None
    if not 1 <= tokens <= MAX_CAPACITY_TOKENS:
        raise click.BadParameter(f"{tokens} is not in the range 1<=x<={MAX_CAPACITY_TOKENS}")
    return tokens


def remote_capacity(value: str) -> int:
    """`--remote-capacity-tokens`: 0 (no remote tier), a token count, or `inf` (holds every block)."""
    if value.strip() == "0":
        return 0
    tokens = capacity(value)
    return MAX_CAPACITY_TOKENS if tokens is None else tokens


@click.command("replay")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--policy", "policies", type=click.Choice(POLICIES), multiple=True, default=("lru",), show_default=True,
              help="Eviction policy (repeat the option to compare several).")
@click.option("--capacity-tokens", default="inf", show_default=True,
              help="Tokens the cache holds per pool (a count, or 'inf' for unbounded).")
@click.option("--memory-gib", default=None, type=click.FloatRange(min=0.0, min_open=True, max=1 << 20),
              help="Instead of --capacity-tokens: GiB of device memory for every pool together, split between "
                   "per-token pages and point snapshots (docs/replay.md).")
@click.option("--state-share", default=None, type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
              help="With --memory-gib: the part of it for point snapshots (default: the trace's own demand).")
@click.option("--state-dtype", default=None, type=click.Choice(["float32", "bfloat16", "float16"]),
              help="Keep a linear layer's recurrent state in this dtype (default: the preset's).")
@click.option("--retain-every-blocks", default=DEFAULT_RETAIN_EVERY_BLOCKS, show_default=True,
              type=click.IntRange(1, MAX_RETAIN_EVERY_BLOCKS), help="A resume point every this many blocks.")
@click.option("--layout", default="llama_full", show_default=True, type=click.Choice(preset_names()),
              help="Preset layout whose manager replays the trace.")
@click.option("--block-tokens", default=512, show_default=True, type=click.IntRange(1, MAX_REQUEST_TOKENS),
              help="Tokens per block: the trace's hash ids name blocks of this size.")
@click.option("--host-tokens", default=0, show_default=True, type=click.IntRange(0, MAX_CAPACITY_TOKENS),
              help="A host tier below the device, in tokens (docs/replay.md: the replay's tier model).")
@click.option("--disk-tokens", default=0, show_default=True, type=click.IntRange(0, MAX_CAPACITY_TOKENS),
              help="A disk tier below the host, in tokens.")
@click.option("--instances", default=None, type=click.IntRange(1, MAX_INSTANCES),
              help="Replay over this many serving instances behind a router, each with --capacity-tokens (and "
                   "--host-tokens / --disk-tokens) of its own (docs/replay.md, cluster replay).")
@click.option("--router", "routers", type=click.Choice(ROUTERS), multiple=True, default=("prefix-aware",),
              show_default=True, help="With --instances: how requests are routed (repeat to compare).")
@click.option("--remote-capacity-tokens", "remote", default="0", show_default=True,
              help="With --instances: a remote tier shared by every instance, in tokens (0: none).")
@click.option("--sweep", is_flag=True, help="Replay at 1k, 3k, 10k, 30k blocks and unbounded; table and PNG. "
                                            "With --instances: over 1, 2, 4 and 8 instances, every --router, "
                                            "without and with the remote tier.")
@click.option("--out", "out_dir", default="out", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the sweep's PNG (replay_sweep.png); created if missing.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def replay_command(trace: str, policies: tuple[str, ...], capacity_tokens: str, memory_gib: float | None,
                   state_share: float | None, state_dtype: str | None, retain_every_blocks: int, layout: str,
                   block_tokens: int, host_tokens: int, disk_tokens: int, instances: int | None,
                   routers: tuple[str, ...], remote: str, sweep: bool, out_dir: str, as_json: bool) -> None:
    """Replay TRACE (Mooncake JSON lines) through the cache manager; print block and token hit rates."""
    if instances is None and remote.strip() != "0":
        raise click.UsageError("--remote-capacity-tokens needs --instances (a remote tier is shared by instances)")
    if memory_gib is not None and (sweep or capacity(capacity_tokens) is not None):
        raise click.UsageError("--memory-gib replaces --capacity-tokens and --sweep: give one")
    if state_share is not None and memory_gib is None:
        raise click.UsageError("--state-share splits --memory-gib: give it too")
    base = ReplayConfig(layout=layout, block_tokens=block_tokens, host_tokens=host_tokens, disk_tokens=disk_tokens,
                        memory_bytes=None if memory_gib is None else int(memory_gib * (1 << 30)),
                        state_share=state_share, state_dtype=state_dtype, retain_every_blocks=retain_every_blocks)
    if sweep and plotting_available():  # the sweep's chart goes there: an unwritable --out fails before the sweep
        writable_folder("--out", Path(out_dir))
    requests = read_trace(trace, block_tokens)
    if instances is not None:
        base = attrs.evolve(base, capacity_tokens=capacity(capacity_tokens))
        _cluster(requests, cluster_configs(base, instances, routers, remote_capacity(remote), sweep),
                 Path(out_dir), block_tokens, sweep, as_json)
    capacities = [None if b is None else b * block_tokens for b in SWEEP_BLOCKS] if sweep \
        else [capacity(capacity_tokens)]
    runs = [(p, c) for p in policies for c in capacities]
    results = []
    with Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=as_json) as bar:
        task = bar.add_task("replaying", total=len(runs) * len(requests))
        for n, (policy, cap) in enumerate(runs):
            config = attrs.evolve(base, capacity_tokens=cap, policy=policy)
            offset = n * len(requests)

            def advance(done: int, base: int = offset) -> None:
                bar.update(task, completed=base + done)

            results.append(replay(requests, config, progress=advance))
    chart = _chart(results, Path(out_dir), block_tokens) if sweep else None
    if as_json:
        first = results[0].to_dict()
        print_json({**first, "results": [r.to_dict() for r in results], "chart": str(chart) if chart else None})
    else:
        _print(results, requests, block_tokens, chart, sweep)
    raise SystemExit(OK)


def _cluster(requests: list[TraceRequest], configs: list[ClusterConfig], folder: Path, block_tokens: int,
             sweep: bool, as_json: bool) -> None:
    with Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=as_json) as bar:
        task = bar.add_task("replaying", total=len(configs) * len(requests))
        results = cluster_results(requests, configs, lambda done: bar.update(task, completed=done))
    chart = write_cluster_chart(results, folder, block_tokens) if sweep else None
    if as_json:
        print_json({"results": [r.to_dict() for r in results], "chart": str(chart) if chart else None})
    else:
        print_cluster(results, len(requests), block_tokens, chart, sweep)
    raise SystemExit(OK)


def _print(results: list[ReplayResult], requests: list[TraceRequest], block_tokens: int, chart: Path | None,
           sweep: bool) -> None:
    table = Table(title=f"hkv replay: {len(requests):,} requests, blocks of {block_tokens} tokens")
    tiered = results[0].tiers is not None
    columns = ["policy", "memory (GiB, state share)" if results[0].memory_bytes else "capacity (blocks)",
               "block hit rate", "token hit rate", "evicted blocks", "requests / s"]
    columns += ["from host / disk (tokens)", "GB loaded host / disk", "load / split / recompute"] if tiered else []
    for column in columns:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for r in results:
        cap = "unbounded" if r.capacity_tokens is None else f"{r.capacity_tokens // block_tokens:,}"
        if r.memory_bytes:
            cap = f"{r.device_bytes / (1 << 30):,.2f} ({r.state_share:.3f})"
        table.add_row(plain(r.policy), cap, f"{r.block_hit_rate:.3f}", f"{r.token_hit_rate:.3f}",
                      f"{r.evicted_blocks:,}", f"{r.requests_per_second:,.0f}", *_tier_cells(r))
    out.print(table)
    if sweep:
        out.print(f"chart: {plain(chart)}" if chart else
                  plain("chart skipped: matplotlib is not installed (pip install 'hkv[plot]')"), highlight=False)


def _tier_cells(r: ReplayResult) -> list[str]:
    """The tier columns of a result (none without tiers); the hit rates above count device hits only."""
    t = r.tiers
    if t is None:
        return []
    gigabytes = f"{t.bytes['host'] / 1e9:,.1f} / {t.bytes['disk'] / 1e9:,.1f}"
    return [f"{t.tokens['host']:,} / {t.tokens['disk']:,}", gigabytes,
            " / ".join(f"{t.decisions[d]:,}" for d in ("load", "split", "recompute"))]


def _chart(results: list[ReplayResult], folder: Path, block_tokens: int) -> Path | None:
    """Hit rate against capacity, one line per policy (the unbounded run as a dashed line)."""
    by_policy: dict[str, list[ReplayResult]] = {}
    for r in results:
        by_policy.setdefault(r.policy, []).append(r)

    def draw(ax: Any) -> None:
        for policy, runs in by_policy.items():
            bounded = [r for r in runs if r.capacity_tokens is not None]
            line = ax.plot([r.capacity_tokens // block_tokens for r in bounded],  # type: ignore[operator]
                           [r.block_hit_rate for r in bounded], marker="o", label=policy)
            for r in runs:
                if r.capacity_tokens is None:
                    ax.axhline(r.block_hit_rate, linestyle="--", color=line[0].get_color(), linewidth=0.8,
                               label=f"{policy}, unbounded")

    return line_chart(folder, CHART_NAME, draw, xlabel=f"capacity (blocks of {block_tokens} tokens)",
                      ylabel="block hit rate")


__all__ = ["capacity", "remote_capacity", "replay_command"]
