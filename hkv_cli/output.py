"""Shared output helpers: JSON to stdout, rich tables and progress to stderr, errors as one line or JSON.

Rich reads `[...]` as markup, so every text that comes from the user (paths,
file names) or holds literal brackets (`'hkv[plot]'`) goes through `plain`
(escaped markup) before it reaches a console.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.text import Text

PIPE_WIDTH = 4096  # stdout to a pipe or a file: wide enough that no table is cut and no line (a path) wrapped


class _Stdout(Console):
    """stdout: at a terminal (or with COLUMNS set) as wide as that; written to a pipe or a file PIPE_WIDTH wide,
    so a table is as wide as its cells need (rich would cut it to 80 columns: `11,0…`)."""

    @property  # type: ignore[misc]  # read-only here: stdout's width is decided above, never set
    def size(self) -> ConsoleDimensions:
        wrapped = super().size
        if self.is_terminal or "COLUMNS" in os.environ:
            return wrapped
        return ConsoleDimensions(PIPE_WIDTH, wrapped.height)


console = Console(stderr=True)
out = _Stdout()


def plain(value: object) -> str:
    """`value` as text with rich markup escaped: it prints exactly as written."""
    return escape(str(value))


def strict(value: Any) -> Any:
    """`value` with every float strict JSON cannot hold (NaN, infinities) as its name: "nan", "inf", "-inf"."""
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {key: strict(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [strict(item) for item in value]
    return value


def print_json(payload: dict[str, Any]) -> None:
    """Machine-readable output: one strict JSON document on stdout (no bare NaN or Infinity)."""
    sys.stdout.write(json.dumps(strict(payload), indent=2, sort_keys=False, default=str, allow_nan=False) + "\n")


def print_error(kind: str, message: str, fields: dict[str, Any], status: int, *, as_json: bool) -> None:
    """An error as one line on stderr, or with --json as {"error": {...}} on stdout."""
    if as_json:
        print_json({"error": {"type": kind, "message": message, "fields": fields, "exit_status": status}})
    else:
        line = Text("error", style="red")
        line.append(f" ({kind}): {message}")
        console.print(line, highlight=False, soft_wrap=True)
