"""NumPy reference executor, exact tiny V4 model and reference engine loop (docs/design.md section 5).

Attributes are loaded on first use, so `import hkv_exec_ref.tiny_v4` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hkv_exec_ref.engine import DraftSpec, Engine, ServeResult
    from hkv_exec_ref.executor import RefExecutor
    from hkv_tiers.remote_config import RemoteFaults, RemoteTierConfig

__all__ = ["DraftSpec", "Engine", "RefExecutor", "RemoteFaults", "RemoteTierConfig", "ServeResult"]

_HOMES = {"DraftSpec": "hkv_exec_ref.engine", "Engine": "hkv_exec_ref.engine", "ServeResult": "hkv_exec_ref.engine",
          "RefExecutor": "hkv_exec_ref.executor", "RemoteFaults": "hkv_tiers.remote_config",
          "RemoteTierConfig": "hkv_tiers.remote_config"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'hkv_exec_ref' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_HOMES[name]), name)
