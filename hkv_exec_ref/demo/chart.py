"""The demo's PNG: cache hit length per request (matplotlib, imported only here, only when drawing).

matplotlib is the `plot` extra (`pip install 'hkv[plot]'`, also in `dev`); without it
`write_chart` returns None and the demo says the chart was skipped.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hkv_exec_ref.demo.runner import DemoReport

CHART_NAME = "demo_hits.png"
KIND_COLORS = {"chat": "#4878d0", "agent": "#ee854a"}
MAX_WIDTH_INCHES = 40.0  # 4,800 pixels at 120 dpi: past about 330 requests the bars get thinner, not the PNG wider


def plotting_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def write_chart(report: DemoReport, out_dir: Path) -> Path | None:
    """Bars: input length (light) and tokens served from the cache (by session kind); None without matplotlib."""
    if not plotting_available():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report.rows
    x = [r.index for r in rows]
    fig, ax = plt.subplots(figsize=(min(MAX_WIDTH_INCHES, max(6.0, len(rows) * 0.12)), 3.6), dpi=120)
    ax.bar(x, [r.input_length for r in rows], color="#dddddd", label="prompt tokens")
    for kind, color in KIND_COLORS.items():
        mine = [r for r in rows if r.kind == kind]
        ax.bar([r.index for r in mine], [r.cached_tokens for r in mine], color=color,
               label=f"from cache ({kind})")
    bad = [r for r in rows if not r.exact]
    if bad:
        ax.scatter([r.index for r in bad], [r.input_length for r in bad], marker="x", color="red",
                   label="differs from recompute", zorder=3)
    ax.set_xlabel("request (arrival order)")
    ax.set_ylabel("tokens")
    ax.set_title(f"hkv demo: cache hit length per request ({report.exact_matches}/{report.requests} exact)")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / CHART_NAME
    fig.savefig(path)
    plt.close(fig)
    return path
