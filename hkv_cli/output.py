"""Shared output helpers: JSON to stdout, rich tables and progress to stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

console = Console(stderr=True)
out = Console()


def print_json(payload: dict[str, Any]) -> None:
    """Machine-readable output: one JSON document on stdout."""
    sys.stdout.write(json.dumps(payload, indent=2, sort_keys=False) + "\n")
