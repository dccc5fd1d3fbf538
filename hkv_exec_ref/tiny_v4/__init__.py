"""Exact tiny DeepSeek-V4-style model in NumPy (docs/v4_cache.md section 7).

A seeded three-layer model (SWA, CSA r=4 with lightning indexer, HCA r=8 by default) whose
cross-token state is the explicit, per-layer, per-object-kind `ModelState` of section 6;
logits served from any saved state equal full recomputation bit for bit.
"""

from hkv_exec_ref.tiny_v4.attention import Probe, Selection
from hkv_exec_ref.tiny_v4.checks import state_problems
from hkv_exec_ref.tiny_v4.config import Config, LayerSpec
from hkv_exec_ref.tiny_v4.faults import Fault, apply_faults, inject
from hkv_exec_ref.tiny_v4.model import Generation, TinyV4
from hkv_exec_ref.tiny_v4.state import (
    LayerState,
    ModelState,
    TailRows,
    expected_sizes,
)
from hkv_exec_ref.tiny_v4.weights import Weights, init_weights

__all__ = [
    "Config",
    "Fault",
    "Generation",
    "LayerSpec",
    "LayerState",
    "ModelState",
    "Probe",
    "Selection",
    "TailRows",
    "TinyV4",
    "Weights",
    "apply_faults",
    "expected_sizes",
    "init_weights",
    "inject",
    "state_problems",
]
