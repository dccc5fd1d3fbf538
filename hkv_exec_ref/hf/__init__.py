"""Hugging Face transformers models served through hkv (docs/hf.md): the `hf` extra (transformers, CPU torch).

Attributes load on first use, so importing this package needs neither transformers nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hkv_exec_ref.hf.engine import HfEngine

__all__ = ["HfEngine"]


def __getattr__(name: str) -> Any:
    if name != "HfEngine":
        raise AttributeError(f"module 'hkv_exec_ref.hf' has no attribute {name!r}")
    from hkv_exec_ref.hf.engine import HfEngine

    return HfEngine
