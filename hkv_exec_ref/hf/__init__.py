"""Hugging Face transformers models served through hkv (docs/hf.md): the `hf` extra (transformers, CPU torch).

Attributes load on first use, so importing this package needs neither transformers nor torch; without them,
`HfEngine` (and `require`) raise MissingDependency naming the extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hkv_core.errors import MissingDependency

if TYPE_CHECKING:
    from hkv_exec_ref.hf.engine import HfEngine

__all__ = ["HF_PACKAGES", "HfEngine", "require"]

HF_PACKAGES = ("torch", "transformers")  # what the `hf` extra installs


def require(action: str = "HfEngine") -> None:
    """MissingDependency (`pip install 'hkv[hf]'`) unless every package of the `hf` extra imports."""
    for package in HF_PACKAGES:
        try:
            importlib.import_module(package)
        except ImportError as err:
            raise MissingDependency(package=package, extra="hf", action=action) from err


def __getattr__(name: str) -> Any:
    if name != "HfEngine":
        raise AttributeError(f"module 'hkv_exec_ref.hf' has no attribute {name!r}")
    require()
    from hkv_exec_ref.hf.engine import HfEngine

    return HfEngine
