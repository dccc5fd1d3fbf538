"""The lifecycle spec: loader, frozen records, guards, compiled table, oracle, diagram."""

from hkv_core.spec.loader import default_lifecycle_path, load_lifecycle
from hkv_core.spec.records import InvariantSpec, KindSpec, LifecycleSpec, TransitionSpec
from hkv_core.spec.table import KindTable, compile_lifecycle

__all__ = [
    "InvariantSpec", "KindSpec", "KindTable", "LifecycleSpec", "TransitionSpec",
    "compile_lifecycle", "default_lifecycle_path", "load_lifecycle",
]
