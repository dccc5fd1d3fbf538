"""The model layout layer: layer groups, pool specs, resume requirements, reports."""

from hkv_core.layout.kinds import AttentionKind, EntryKind, ObjectKind
from hkv_core.layout.model import Layout
from hkv_core.layout.presets import load_preset_config, preset_names
from hkv_core.layout.records import LayerGroup, PoolSpec

__all__ = [
    "AttentionKind",
    "EntryKind",
    "LayerGroup",
    "Layout",
    "ObjectKind",
    "PoolSpec",
    "load_preset_config",
    "preset_names",
]
