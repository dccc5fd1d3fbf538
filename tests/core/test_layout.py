"""Preset layouts (exact figures) and HF-config equivalence; bad configs: test_layout_errors."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from hkv_core.layout import (
    AttentionKind,
    EntryKind,
    Layout,
    ObjectKind,
    load_preset_config,
    preset_names,
)
from hkv_core.layout.report import format_report_text, inspect_report, load_layout
from hkv_core.spec_paths import specs_dir

PRESETS = ["deepseek_v4_flash", "deepseek_v4_pro", "llama_full", "swa_full", "tiny_v4", "tiny_csa",
           "deepseek_v3", "qwen_full", "mistral_swa"]


def kinds(layout: Layout) -> list[tuple[str, int, int]]:
    return [(g.kind.value, g.compress_ratio, g.layer_count) for g in layout.groups]


def test_presets_are_found() -> None:
    assert set(PRESETS) <= set(preset_names())
    assert (specs_dir() / "presets" / "tiny_v4.toml").is_file()


def test_deepseek_v4_flash_acceptance_figures() -> None:
    report = inspect_report(load_layout("deepseek_v4_flash"), 1000)
    assert json.loads(json.dumps(report)) == report
    assert report["model"] == "deepseek_v4_flash" and report["main_layers"] == 43
    assert report["mtp_layers"] == 1 and report["window_tokens"] == 128
    assert report["layers_by_kind"] == {"SWA": 2, "CSA": 21, "HCA": 20}
    swa, csa, hca = report["groups"]
    assert (swa["kind"], swa["layers"], swa["compress_ratio"]) == ("SWA", 2, 0)
    assert (csa["kind"], csa["layers"], csa["compress_ratio"]) == ("CSA", 21, 4)
    assert (hca["kind"], hca["layers"], hca["compress_ratio"]) == ("HCA", 20, 128)
    assert csa["indexer"] == {"n_heads": 64, "head_dim": 128, "topk": 512}
    assert swa["layer_ids"] == [0, 1] and csa["layer_ids"] == list(range(2, 43, 2))
    assert hca["layer_ids"] == list(range(3, 43, 2))
    assert all(g["window_tokens"] == 128 for g in report["groups"])
    r_swa, r_csa, r_hca = report["resume"]["groups"]
    assert (r_csa["compressed_entries"], r_hca["compressed_entries"]) == (250, 7)
    assert r_csa["indexer_keys"] == 250 and r_swa["compressed_entries"] == 0
    assert r_csa["tail_rows"] == {"overlap": 4, "remainder": 0, "total": 4,
                                  "start_token": 996, "padding": 0}
    assert r_csa["indexer_tail_rows"] == r_csa["tail_rows"]
    assert r_hca["tail_rows"]["total"] == r_hca["tail_rows"]["remainder"] == 104
    assert all(g["window_rows"] == 127 for g in report["resume"]["groups"])
    assert all(g["window_tokens"] == [873, 1000] for g in report["resume"]["groups"])
    assert report["resume"]["mtp_groups"][0]["window_rows"] == 127


def test_deepseek_v4_flash_pools() -> None:
    layout = Layout.from_preset("deepseek_v4_flash")
    assert [p.name for p in layout.pools_of("csa")] == [
        "csa.compressed_kv", "csa.compressor_tail", "csa.swa_window",
        "csa.indexer_state.keys", "csa.indexer_state.tail"]
    assert [p.name for p in layout.pools_of("hca")] == [
        "hca.compressed_kv", "hca.compressor_tail", "hca.swa_window"]
    assert [p.name for p in layout.pools_of("swa")] == ["swa.swa_window"]
    kv = layout.pool("csa.compressed_kv")
    assert kv.abi_id == "compressed_kv/bf16/[512]/e64/v1" and kv.tokens_per_page == 256
    tail = layout.pool("csa.compressor_tail")
    assert (tail.dtype, tail.entry_shape, tail.entries_per_page) == ("fp32", (2, 1024), 8)
    assert layout.pool("hca.compressor_tail").entry_shape == (2, 512)
    assert layout.pool("csa.indexer_state.keys").entry_shape == (128,)
    assert layout.pool("csa.indexer_state.tail").entry_shape == (2, 256)
    assert layout.bytes_per_token(ObjectKind.COMPRESSED_KV) == 21 * 1024 / 4 + 20 * 1024 / 128
    assert layout.bytes_per_token(ObjectKind.SWA_WINDOW) == 43 * 1024
    assert [g.name for g in layout.mtp_groups] == ["mtp_swa"]
    assert layout.group_of_layer(43).draft


def test_deepseek_v4_pro() -> None:
    layout = Layout.from_preset("deepseek_v4_pro")
    assert (layout.main_layers, layout.hidden_size, layout.num_attention_heads) == (61, 7168, 128)
    assert kinds(layout) == [("CSA", 4, 30), ("HCA", 128, 31)]
    assert layout.group("csa").index_topk == 1024
    assert layout.group("hca").layer_ids[:3] == (0, 1, 3)
    report = inspect_report(layout, 1000)
    assert [g["compressed_entries"] for g in report["resume"]["groups"]] == [250, 7]


def test_llama_full_stores_raw_kv_as_ratio_one_entries() -> None:
    layout = Layout.from_preset("llama_full")
    assert kinds(layout) == [("FULL", 1, 32)] and layout.window_tokens == 0
    (pool,) = layout.pools
    assert (pool.object_kind, pool.compress_ratio, pool.entry_shape) == (
        ObjectKind.COMPRESSED_KV, 1, (2, 8, 128))
    assert pool.page_bytes % 4096 == 0 and pool.tokens_per_page == pool.entries_per_page
    (req,) = inspect_report(layout, 777)["resume"]["groups"]
    assert req["compressed_entries"] == 777 and req["tail_rows"]["total"] == 0
    assert req["window_rows"] == 0 and req["bytes"] == 32 * 777 * 4096


def test_swa_full_alternates_sliding_and_full_groups() -> None:
    layout = Layout.from_preset("swa_full")
    assert kinds(layout) == [("SWA", 0, 12), ("FULL", 1, 12)]
    assert layout.group("swa").layer_ids == tuple(range(0, 24, 2))
    assert [p.object_kind for p in layout.pools_of("swa")] == [ObjectKind.SWA_WINDOW]
    assert [p.object_kind for p in layout.pools_of("full")] == [ObjectKind.COMPRESSED_KV]
    assert layout.group("full").window_tokens == 0 and layout.window_tokens == 128
    assert layout.pool("swa.swa_window").entry_shape == (2, 8, 64)


def test_deepseek_v3_caches_one_576_wide_latent_per_token_and_layer() -> None:
    layout = Layout.from_preset("deepseek_v3")
    assert (layout.model_type, layout.family) == ("deepseek_v3", "mla")
    assert kinds(layout) == [("FULL", 1, 61)] and [g.name for g in layout.mtp_groups] == ["mtp_full"]
    assert (layout.num_key_value_heads, layout.head_dim, layout.rope_head_dim) == (1, 576, 64)
    (pool,) = layout.pools
    assert (pool.object_kind, pool.entry_shape, pool.entry_bytes) == (ObjectKind.COMPRESSED_KV, (576,), 1152)
    assert pool.abi_id == "compressed_kv/bf16/[576]/e64/v1" and pool.tokens_per_page == 64
    assert layout.bytes_per_token(ObjectKind.COMPRESSED_KV) == 61 * 576 * 2  # 70,272: not 61 * 2 * 128 * 56 * 2
    assert layout.mtp_pools[0].entry_shape == (576,) and layout.window_tokens == 0
    (req,) = inspect_report(layout, 1000)["resume"]["groups"]
    assert (req["compressed_entries"], req["window_rows"], req["bytes"]) == (1000, 0, 61 * 1000 * 1152)


def test_qwen_full_is_full_attention_although_it_names_a_window() -> None:
    layout = Layout.from_preset("qwen_full")
    assert kinds(layout) == [("FULL", 1, 28)] and layout.window_tokens == 0
    assert (layout.num_attention_heads, layout.num_key_value_heads, layout.head_dim) == (28, 4, 128)
    assert layout.pool("full.compressed_kv").entry_shape == (2, 4, 128)
    assert layout.bytes_per_token(ObjectKind.COMPRESSED_KV) == 28 * 2 * 4 * 128 * 2


def test_mistral_swa_keeps_only_a_window_in_every_layer() -> None:
    layout = Layout.from_preset("mistral_swa")
    assert kinds(layout) == [("SWA", 0, 32)] and layout.window_tokens == 4096
    assert [p.object_kind for p in layout.pools] == [ObjectKind.SWA_WINDOW]
    (req,) = inspect_report(layout, 5000)["resume"]["groups"]
    assert req["window_rows"] == 4095 and req["window_tokens"] == [905, 5000]


def test_tiny_v4() -> None:
    layout = Layout.from_preset("tiny_v4")
    assert kinds(layout) == [("SWA", 0, 1), ("CSA", 4, 1), ("HCA", 8, 1)]
    csa = layout.group("csa")
    assert (csa.index_n_heads, csa.index_head_dim, csa.index_topk) == (2, 8, 2)
    assert (layout.window_tokens, layout.head_dim, layout.rope_head_dim) == (8, 16, 8)
    assert (layout.vocab_size, layout.kv_dtype, layout.block_tokens) == (64, "fp32", 8)
    assert layout.mtp_groups == () and layout.mtp_pools == ()


@pytest.mark.parametrize("name", PRESETS)
def test_from_hf_config_equals_from_preset(name: str, tmp_path: Path) -> None:
    config = load_preset_config(name)
    assert Layout.from_hf_config(config, name=name) == Layout.from_preset(name)
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    from_file = load_layout(str(path))
    assert from_file.name == name and from_file.source == str(path)
    assert attrs.evolve(from_file, source=name) == Layout.from_preset(name)
    assert load_layout(str(path.parent)).pools == from_file.pools


@pytest.mark.parametrize("name", PRESETS)
def test_layout_invariants(name: str) -> None:
    layout = Layout.from_preset(name)
    for group in layout.all_groups:
        pools = layout.pools_of(group.name)
        objects = {p.object_kind for p in pools}
        assert (ObjectKind.SWA_WINDOW in objects) == (group.window_tokens > 0)
        assert (ObjectKind.INDEXER_STATE in objects) == (group.kind is AttentionKind.CSA)
        assert (ObjectKind.COMPRESSOR_TAIL in objects) == (group.compress_ratio >= 4)
        assert (ObjectKind.COMPRESSED_KV in objects) == (group.compress_ratio >= 1)
    for pool in layout.all_pools:
        assert pool.page_bytes % pool.alignment_bytes == 0
        is_tail = pool.entry_kind is EntryKind.TAIL_ROW
        assert is_tail or pool.tokens_per_page % layout.block_tokens == 0
    memory_layouts = {(p.object_kind, p.entry_kind, p.dtype, p.entry_shape, p.entries_per_page)
                      for p in layout.all_pools}
    abi_ids = {p.abi_id for p in layout.all_pools}
    pairs = {(p.abi_id, p.object_kind, p.entry_kind, p.dtype, p.entry_shape, p.entries_per_page)
             for p in layout.all_pools}
    assert len(abi_ids) == len(memory_layouts) == len(pairs)  # abi id <-> exact memory layout
    assert name in format_report_text(inspect_report(layout, 5))


def test_layout_is_immutable() -> None:
    layout = Layout.from_preset("tiny_v4")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        layout.block_tokens = 16  # type: ignore[misc]


def test_block_tokens_override() -> None:
    layout = Layout.from_preset("deepseek_v4_flash", block_tokens=128)
    assert layout.block_tokens == 128
    assert layout.pool("csa.compressed_kv").tokens_per_page == 128
