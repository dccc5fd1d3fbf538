"""``hkv inspect``: a JSON-serialisable report of a layout (and a resume point), and its text.

``inspect_report`` returns only dicts, lists, strings, ints, floats, bools and
``None``; the CLI prints it verbatim with ``--json``.  Schema ``hkv.inspect/v1``:
see ``_layout_dict``, ``_group_dict``, ``_pool_dict`` and ``_resume_dict``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hkv_core.errors import ConfigError
from hkv_core.layout.model import Layout
from hkv_core.layout.presets import config_name, load_config_file
from hkv_core.layout.records import LayerGroup, PoolSpec
from hkv_core.layout.resume import GroupRequirements, TailRows, resume_requirements
from hkv_core.layout.text import format_report_text

REPORT_SCHEMA = "hkv.inspect/v1"  # the format tag of `hkv inspect --json`
CONFIG_SUFFIXES = (".json", ".toml")
PADDING_NOTE = ("tail_rows.padding overlap rows are the padding sentinel (a = 0, z = -inf):"
                " no compressed block is complete yet")

__all__ = ["REPORT_SCHEMA", "format_report_text", "inspect_report", "load_layout"]


def load_layout(name_or_path: str) -> Layout:
    """A preset name, or a path to a HF ``config.json`` (or its directory, or a .toml)."""
    path = Path(name_or_path)
    if path.exists():
        config = load_config_file(path)
        return Layout.from_hf_config(config, name=config_name(path), source=str(path))
    if path.suffix in CONFIG_SUFFIXES or len(path.parts) > 1:
        raise ConfigError("no such config file", source=name_or_path, key="path")
    return Layout.from_preset(name_or_path)


def inspect_report(layout: Layout, prefix_tokens: int | None) -> dict[str, Any]:
    """The layout report; with ``prefix_tokens``, also the resume requirements at P."""
    report = _layout_dict(layout)
    report["resume"] = None if prefix_tokens is None else _resume_dict(layout, prefix_tokens)
    return report


def _layout_dict(layout: Layout) -> dict[str, Any]:
    layers_by_kind: dict[str, int] = {}
    for group in layout.groups:
        kind = group.kind.value
        layers_by_kind[kind] = layers_by_kind.get(kind, 0) + group.layer_count
    return {
        "schema": REPORT_SCHEMA,
        "model": layout.name,
        "source": layout.source,
        "model_type": layout.model_type,
        "family": layout.family,
        "main_layers": layout.main_layers,
        "mtp_layers": layout.mtp_layers,
        "layers_by_kind": layers_by_kind,
        "hidden_size": layout.hidden_size,
        "num_attention_heads": layout.num_attention_heads,
        "num_key_value_heads": layout.num_key_value_heads,
        "head_dim": layout.head_dim,
        "rope_head_dim": layout.rope_head_dim,
        "vocab_size": layout.vocab_size,
        "kv_dtype": layout.kv_dtype,
        "window_tokens": layout.window_tokens,
        "block_tokens": layout.block_tokens,
        "alignment_bytes": layout.alignment_bytes,
        "groups": [_group_dict(group) for group in layout.groups],
        "mtp_groups": [_group_dict(group) for group in layout.mtp_groups],
        "pools": [_pool_dict(pool) for pool in layout.pools],
        "mtp_pools": [_pool_dict(pool) for pool in layout.mtp_pools],
        "bytes_per_token": {k.value: layout.bytes_per_token(k) for k in layout.object_kinds()},
        "recurrent_state_bytes": layout.recurrent_state_bytes(),
    }


def _group_dict(group: LayerGroup) -> dict[str, Any]:
    indexer = None
    if group.has_indexer:
        indexer = {"n_heads": group.index_n_heads, "head_dim": group.index_head_dim,
                   "topk": group.index_topk}
    return {
        "name": group.name,
        "kind": group.kind.value,
        "compress_ratio": group.compress_ratio,
        "layers": group.layer_count,
        "layer_ids": list(group.layer_ids),
        "window_tokens": group.window_tokens,
        "indexer": indexer,
        "draft": group.draft,
        "recurrent_state": None if group.state is None else {
            "mixer": group.state.mixer, "conv_shape": list(group.state.conv_shape),
            "conv_dtype": group.state.conv_dtype,
            "ssm_shape": list(group.state.ssm_shape), "ssm_dtype": group.state.ssm_dtype,
            "bytes_per_layer": group.state.bytes_per_layer},
    }


def _pool_dict(pool: PoolSpec) -> dict[str, Any]:
    return {
        "name": pool.name,
        "group_name": pool.group_name,
        "object_kind": pool.object_kind.value,
        "entry_kind": pool.entry_kind.value,
        "compress_ratio": pool.compress_ratio,
        "layer_count": pool.layer_count,
        "dtype": pool.dtype,
        "entry_shape": list(pool.entry_shape),
        "entry_bytes": pool.entry_bytes,
        "entries_per_page": pool.entries_per_page,
        "tokens_per_page": pool.tokens_per_page,
        "page_bytes": pool.page_bytes,
        "alignment_bytes": pool.alignment_bytes,
        "abi_id": pool.abi_id,
        "bytes_per_token": pool.bytes_per_token,
    }


def _resume_dict(layout: Layout, prefix_tokens: int) -> dict[str, Any]:
    req = resume_requirements(layout, prefix_tokens)
    groups = [_requirements_dict(g) for g in req.groups]
    mtp_groups = [_requirements_dict(g) for g in req.mtp_groups]
    padded = any(g.tail.padding for g in req.groups + req.mtp_groups)
    return {
        "prefix_tokens": req.prefix_tokens,
        "bytes": req.bytes,
        "mtp_bytes": req.mtp_bytes,
        "groups": groups,
        "mtp_groups": mtp_groups,
        "notes": [PADDING_NOTE] if padded else [],
    }


def _tail_dict(tail: TailRows) -> dict[str, int]:
    return {"overlap": tail.overlap, "remainder": tail.remainder, "total": tail.total,
            "start_token": tail.start_token, "padding": tail.padding}


def _requirements_dict(g: GroupRequirements) -> dict[str, Any]:
    return {
        "name": g.group_name,
        "kind": g.kind.value,
        "compress_ratio": g.compress_ratio,
        "layers": len(g.layer_ids),
        "layer_ids": list(g.layer_ids),
        "compressed_entries": g.compressed_entries,
        "compressed_tokens": list(g.compressed_tokens),
        "indexer_keys": g.indexer_keys,
        "tail_rows": _tail_dict(g.tail),
        "indexer_tail_rows": None if g.indexer_tail is None else _tail_dict(g.indexer_tail),
        "window_rows": g.window_rows,
        "window_tokens": list(g.window_token_range),
        "state_entries": g.state_entries,
        "pools": [{"pool": n.pool_name, "entries": n.entries, "bytes": n.bytes} for n in g.pools],
        "bytes_per_layer": g.bytes_per_layer,
        "bytes": g.bytes,
    }
