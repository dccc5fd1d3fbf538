"""The model layout layer: layer groups, pool specs, resume requirements, reports."""

from hkv_core.layout.engine import EngineGroup, engine_layout
from hkv_core.layout.kinds import AttentionKind, EntryKind, ObjectKind
from hkv_core.layout.model import Layout
from hkv_core.layout.presets import load_preset_config, preset_names
from hkv_core.layout.records import LayerGroup, PoolSpec
from hkv_core.layout.report import format_report_text, inspect_report, load_layout
from hkv_core.layout.resume import ResumeRequirements, resume_requirements

__all__ = [
    "AttentionKind",
    "EngineGroup",
    "EntryKind",
    "LayerGroup",
    "Layout",
    "ObjectKind",
    "PoolSpec",
    "ResumeRequirements",
    "engine_layout",
    "format_report_text",
    "inspect_report",
    "load_layout",
    "load_preset_config",
    "preset_names",
    "resume_requirements",
]
