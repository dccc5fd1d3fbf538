"""Reusable test machinery: the manager state machine, the brute-force hit reference, spec mutations, guard views.

The names below load on first use: `make_manager_machine` needs hypothesis (the dev extra), the others do not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hkv_core.testing.brute_force import brute_force_hit_tokens
    from hkv_core.testing.guard_views import permissive, refusing
    from hkv_core.testing.manager_machine import make_manager_machine
    from hkv_core.testing.spec_mutation import mutated_spec

__all__ = ["brute_force_hit_tokens", "make_manager_machine", "mutated_spec", "permissive", "refusing"]

_HOMES = {"brute_force_hit_tokens": "hkv_core.testing.brute_force", "permissive": "hkv_core.testing.guard_views",
          "refusing": "hkv_core.testing.guard_views", "make_manager_machine": "hkv_core.testing.manager_machine",
          "mutated_spec": "hkv_core.testing.spec_mutation"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'hkv_core.testing' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_HOMES[name]), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
