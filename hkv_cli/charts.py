"""The command line's line charts (matplotlib, the `plot` extra, imported only when drawing)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hkv_cli.errors import output_folder, writing
from hkv_exec_ref.demo.chart import plotting_available

__all__ = ["line_chart"]


def line_chart(folder: Path, name: str, draw: Callable[[Any], None], *, xlabel: str, ylabel: str,
               log_base: float = 10) -> Path | None:
    """`draw(ax)` on log-x axes, labelled and saved as `folder/name` (--out); None without matplotlib."""
    if not plotting_available():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = output_folder("--out", folder)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    draw(ax)
    ax.set_xscale("log", base=log_base)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = folder / name
    with writing("--out", path):
        fig.savefig(path)
    plt.close(fig)
    return path
