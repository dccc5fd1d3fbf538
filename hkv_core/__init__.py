"""hkv_core: the KV-cache state manager for hybrid-attention LLMs (pure Python and NumPy; docs/api.md).

The names below load on first use, so `import hkv_core.layout` (or any other
submodule) imports no more than it needs; `from hkv_core import CacheManager`
loads the manager.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hkv_core.errors import HkvError
    from hkv_core.layout import Layout
    from hkv_core.manager import CacheManager, ManagerConfig, check_invariants

__version__ = "0.1.0"  # equal to pyproject.toml's [project] version (tests/core/test_public_api.py checks)

__all__ = ["CacheManager", "HkvError", "Layout", "ManagerConfig", "check_invariants"]

_HOMES = {"CacheManager": "hkv_core.manager", "ManagerConfig": "hkv_core.manager",
          "check_invariants": "hkv_core.manager", "Layout": "hkv_core.layout", "HkvError": "hkv_core.errors"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'hkv_core' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
