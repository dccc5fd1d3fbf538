"""A tiny exact DeepSeek-V3.2-style model (MLA latents, lightning indexer, top-k sparse attention) served by hkv."""

from hkv_exec_ref.tiny_v32.model import TinyV32, V32Config, V32State
from hkv_exec_ref.tiny_v32.serve import V32Served, V32Server

__all__ = ["TinyV32", "V32Config", "V32Served", "V32Server", "V32State"]
