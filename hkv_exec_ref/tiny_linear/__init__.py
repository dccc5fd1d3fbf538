"""A tiny exact linear-attention hybrid (Qwen3-Next style) and its serving loop through hkv (docs/models.md)."""

from hkv_exec_ref.tiny_linear.model import HybridConfig, HybridState, TinyHybrid
from hkv_exec_ref.tiny_linear.serve import Generated, HybridServer, Served

__all__ = ["Generated", "HybridConfig", "HybridServer", "HybridState", "Served", "TinyHybrid"]
