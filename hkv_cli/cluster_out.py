"""`hkv replay --instances`: running, printing and charting cluster replays (hkv_core.replay.cluster)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from hkv_cli.charts import line_chart
from hkv_cli.output import out, plain
from hkv_core.replay import ReplayConfig, TraceRequest
from hkv_core.replay.cluster import ClusterConfig, ClusterResult, cluster_replay

__all__ = ["CLUSTER_CHART", "SWEEP_INSTANCES", "cluster_configs", "cluster_results", "print_cluster",
           "write_cluster_chart"]

SWEEP_INSTANCES = (1, 2, 4, 8)  # --sweep with --instances: these instance counts
CLUSTER_CHART = "replay_cluster.png"  # the sweep's chart, in --out


def cluster_configs(base: ReplayConfig, instances: int, routers: Sequence[str], remote_tokens: int,
                    sweep: bool) -> list[ClusterConfig]:
    """One run per router (at `instances`); with `sweep`, per instance count of SWEEP_INSTANCES, per router,
    without and (when `remote_tokens`) with the remote tier."""
    counts = SWEEP_INSTANCES if sweep else (instances,)
    remotes = sorted({0, remote_tokens}) if sweep else [remote_tokens]
    return [ClusterConfig(instance=base, instances=n, router=r, remote_tokens=t)
            for t in remotes for r in routers for n in counts]


def cluster_results(requests: list[TraceRequest], configs: list[ClusterConfig],
                    progress: Callable[[int], None]) -> list[ClusterResult]:
    """Every configuration in turn; `progress(done)` counts requests over all of them."""
    results = []
    for n, config in enumerate(configs):
        def advance(done: int, base: int = n * len(requests)) -> None:
            progress(base + done)
        results.append(cluster_replay(requests, config, progress=advance))
    return results


def print_cluster(results: list[ClusterResult], requests: int, block_tokens: int, chart: Path | None,
                  sweep: bool) -> None:
    """One row per run: instances, router, remote tier, token hit rate, shares by source, spread of requests."""
    table = Table(title=f"hkv replay: {requests:,} requests over a cluster, blocks of {block_tokens} tokens")
    for column in ("instances", "router", "remote (blocks)", "token hit rate", "device / host+disk / remote",
                   "requests per instance (min-max)"):
        table.add_column(column, justify="left" if column == "router" else "right")
    for r in results:
        src = r.tokens_by_source
        shares = " / ".join(f"{n / max(1, r.prompt_tokens):.3f}" for n in
                            (src["device"], src["host"] + src["disk"], src["remote"]))
        table.add_row(str(r.instances), plain(r.router), f"{r.remote_tokens // block_tokens:,}",
                      f"{r.token_hit_rate:.3f}", shares,
                      f"{min(r.requests_per_instance):,}-{max(r.requests_per_instance):,}")
    out.print(table)
    if sweep:
        out.print(f"chart: {plain(chart)}" if chart else
                  plain("chart skipped: matplotlib is not installed (pip install 'hkv[plot]')"), highlight=False)


def write_cluster_chart(results: list[ClusterResult], folder: Path, block_tokens: int) -> Path | None:
    """Token hit rate against the number of instances, one line per (router, remote tier)."""
    lines: dict[tuple[str, int], list[ClusterResult]] = {}
    for r in results:
        lines.setdefault((r.router, r.remote_tokens), []).append(r)

    def draw(ax: Any) -> None:
        for (router, remote), runs in lines.items():
            label = f"{router}, " + (f"remote {remote // block_tokens:,} blocks" if remote else "no remote tier")
            ax.plot([r.instances for r in runs], [r.token_hit_rate for r in runs], marker="o",
                    linestyle="-" if remote else "--", label=label)

    return line_chart(folder, CLUSTER_CHART, draw, xlabel="serving instances", ylabel="token hit rate", log_base=2)
