"""Injected-fault switches of the tiers' tests: a counter per fault, taken one firing at a time, thread-safe."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

_LOCK = threading.Lock()  # tiers take faults on worker threads


def take_fault(switches: Any, name: str, fired: Counter[str]) -> bool:
    """Whether fault `name` of `switches` fires now (then one fewer is left, and it is counted in `fired`)."""
    with _LOCK:
        left = int(getattr(switches, name))
        if left:
            setattr(switches, name, left - 1)
            fired[name] += 1
    return left > 0
