"""Every malformed config raises ConfigError naming its source and the offending key.

Bounds (each size's upper limit) are tested in test_config_bounds.py."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hkv_core.errors import ConfigError
from hkv_core.layout import Layout, load_preset_config
from hkv_core.layout.report import load_layout

Edit = Callable[[dict[str, Any]], None]


def setter(key: str, value: Any) -> Edit:
    def edit(config: dict[str, Any]) -> None:
        config[key] = value
    return edit


def deleter(key: str) -> Edit:
    def edit(config: dict[str, Any]) -> None:
        del config[key]
    return edit


def hkv(table: Any) -> Edit:
    return setter("hkv", table)


def updater(**changes: Any) -> Edit:
    def edit(config: dict[str, Any]) -> None:
        config.update(changes)
    return edit


def drop_head_dim_and_set_hidden(hidden: int) -> Edit:
    def edit(config: dict[str, Any]) -> None:
        del config["head_dim"]
        config["hidden_size"] = hidden
    return edit


CASES: list[tuple[str, str, Edit, str]] = [
    # (preset, case id, edit, expected key)
    ("deepseek_v4_flash", "layers missing", deleter("num_hidden_layers"), "num_hidden_layers"),
    ("deepseek_v4_flash", "layers str", setter("num_hidden_layers", "43"), "num_hidden_layers"),
    ("deepseek_v4_flash", "layers zero", setter("num_hidden_layers", 0), "num_hidden_layers"),
    ("deepseek_v4_flash", "hidden bool", setter("hidden_size", True), "hidden_size"),
    ("deepseek_v4_flash", "heads negative", setter("num_attention_heads", -64),
     "num_attention_heads"),
    ("deepseek_v4_flash", "mtp negative", setter("num_nextn_predict_layers", -1),
     "num_nextn_predict_layers"),
    ("deepseek_v4_flash", "ratio 3", setter("compress_ratios", [3] * 43), "compress_ratios"),
    ("deepseek_v4_flash", "ratio 12", setter("compress_ratios", [0] * 42 + [12]),
     "compress_ratios"),
    ("deepseek_v4_flash", "ratio negative", setter("compress_ratios", [-4] * 43),
     "compress_ratios"),
    ("deepseek_v4_flash", "ratios short", setter("compress_ratios", [0] * 42), "compress_ratios"),
    ("deepseek_v4_flash", "ratios empty", setter("compress_ratios", []), "compress_ratios"),
    ("deepseek_v4_flash", "ratios str", setter("compress_ratios", "0,4"), "compress_ratios"),
    ("deepseek_v4_flash", "window 1", setter("sliding_window", 1), "sliding_window"),
    ("deepseek_v4_flash", "window missing", deleter("sliding_window"), "sliding_window"),
    ("deepseek_v4_flash", "window float", setter("sliding_window", 128.0), "sliding_window"),
    ("deepseek_v4_flash", "topk 0", setter("index_topk", 0), "index_topk"),
    ("deepseek_v4_flash", "index dim missing", deleter("index_head_dim"), "index_head_dim"),
    ("deepseek_v4_flash", "index heads null", setter("index_n_heads", None), "index_n_heads"),
    ("deepseek_v4_flash", "head dim missing", deleter("head_dim"), "head_dim"),
    ("deepseek_v4_flash", "rope too wide", setter("qk_rope_head_dim", 513), "qk_rope_head_dim"),
    ("deepseek_v4_flash", "dtype int8", setter("torch_dtype", "int8"), "torch_dtype"),
    ("deepseek_v4_flash", "dtype number", setter("torch_dtype", 16), "torch_dtype"),
    ("deepseek_v4_flash", "block 0", hkv({"block_tokens": 0}), "hkv.block_tokens"),
    ("deepseek_v4_flash", "hkv unknown", hkv({"bogus": 1}), "hkv.bogus"),
    ("deepseek_v4_flash", "alignment 100", hkv({"alignment_bytes": 100}), "hkv.alignment_bytes"),
    ("deepseek_v4_flash", "hkv not table", hkv(5), "hkv"),
    ("swa_full", "layer type unknown",
     setter("layer_types", ["sliding_attention", "linear_attention"] * 12), "layer_types"),
    ("swa_full", "layer types short", setter("layer_types", ["full_attention"]), "layer_types"),
    ("swa_full", "layer types ints", setter("layer_types", [1] * 24), "layer_types"),
    ("swa_full", "sliding window missing", deleter("sliding_window"), "sliding_window"),
    ("swa_full", "sliding window 0", setter("sliding_window", 0), "sliding_window"),
    ("llama_full", "head dim not derivable",
     drop_head_dim_and_set_hidden(4097), "head_dim"),
    ("llama_full", "kv heads 0", setter("num_key_value_heads", 0), "num_key_value_heads"),
    ("mistral_swa", "all-sliding window 1", setter("sliding_window", 1), "sliding_window"),
    ("qwen_full", "use_sliding_window str", setter("use_sliding_window", "yes"), "use_sliding_window"),
    ("llama_full", "vocab negative", setter("vocab_size", -1), "vocab_size"),
    # the model type: required, known, a string
    ("llama_full", "model type missing", deleter("model_type"), "model_type"),
    ("llama_full", "model type null", setter("model_type", None), "model_type"),
    ("llama_full", "model type unknown", setter("model_type", "gemma7"), "model_type"),
    ("llama_full", "model type number", setter("model_type", 3), "model_type"),
    ("deepseek_v3", "deepseek_v32 needs its indexer", setter("model_type", "deepseek_v32"), "index_n_heads"),
    # keys that contradict the type
    ("deepseek_v4_flash", "v4 compress_ratio for compress_ratios",
     lambda c: c.update(compress_ratio=c.pop("compress_ratios")), "compress_ratio"),
    ("deepseek_v4_flash", "v4 without compress_ratios", deleter("compress_ratios"), "compress_ratios"),
    ("deepseek_v4_flash", "v4 eight kv heads", setter("num_key_value_heads", 8), "num_key_value_heads"),
    ("deepseek_v4_flash", "v4 layer_types", setter("layer_types", ["full_attention"] * 43), "layer_types"),
    ("deepseek_v4_flash", "v4 kv_lora_rank", setter("kv_lora_rank", 512), "kv_lora_rank"),
    ("deepseek_v3", "mla without kv_lora_rank", deleter("kv_lora_rank"), "kv_lora_rank"),
    ("deepseek_v3", "mla without qk_rope_head_dim", deleter("qk_rope_head_dim"), "qk_rope_head_dim"),
    ("deepseek_v3", "mla without qk_nope_head_dim", deleter("qk_nope_head_dim"), "qk_nope_head_dim"),
    ("deepseek_v3", "mla without v_head_dim", deleter("v_head_dim"), "v_head_dim"),
    ("deepseek_v3", "mla kv_lora_rank 0", setter("kv_lora_rank", 0), "kv_lora_rank"),
    ("deepseek_v3", "mla with compress_ratios", setter("compress_ratios", [4] * 61), "compress_ratios"),
    ("deepseek_v3", "mla with index_topk", setter("index_topk", 2048), "index_topk"),
    ("deepseek_v3", "mla with sliding_window", setter("sliding_window", 4096), "sliding_window"),
    ("deepseek_v3", "mla with layer_types", setter("layer_types", ["full_attention"] * 61), "layer_types"),
    ("deepseek_v3", "mla kv heads above heads", setter("num_key_value_heads", 256), "num_key_value_heads"),
    ("llama_full", "llama with compress_ratios", setter("compress_ratios", [0] * 32), "compress_ratios"),
    ("llama_full", "llama with compress_ratio", setter("compress_ratio", 4), "compress_ratio"),
    ("llama_full", "llama with kv_lora_rank", setter("kv_lora_rank", 512), "kv_lora_rank"),
    ("llama_full", "llama with sliding_window", setter("sliding_window", 4096), "sliding_window"),
    ("llama_full", "llama with layer_types", setter("layer_types", ["full_attention"] * 32), "layer_types"),
    ("mistral_swa", "mistral with layer_types", setter("layer_types", ["sliding_attention"] * 32),
     "layer_types"),
    ("swa_full", "gpt_oss without layer_types", deleter("layer_types"), "layer_types"),
    ("qwen_full", "qwen sliding without max_window_layers",
     lambda c: c.update(use_sliding_window=True, max_window_layers=None), "max_window_layers"),
    ("qwen_full", "qwen sliding without a window",
     updater(use_sliding_window=True, max_window_layers=4, sliding_window=None), "sliding_window"),
    ("qwen_full", "qwen sliding layer_types with use_sliding_window false",
     setter("layer_types", ["sliding_attention"] * 28), "layer_types"),
    # impossible head counts and widths
    ("llama_full", "kv heads above heads", setter("num_key_value_heads", 64), "num_key_value_heads"),
    ("llama_full", "heads not a multiple of kv heads", setter("num_key_value_heads", 6),
     "num_key_value_heads"),
    ("qwen_full", "hidden not divisible by heads", setter("hidden_size", 3585), "head_dim"),
    ("llama_full", "derived head_dim too wide",
     lambda c: c.update(head_dim=None, num_attention_heads=1, num_key_value_heads=1, hidden_size=1 << 17),
     "head_dim"),
    ("tiny_v4", "v4 rope wider than head", setter("qk_rope_head_dim", 17), "qk_rope_head_dim"),
]


@pytest.mark.parametrize(("preset", "edit", "key"), [(p, e, k) for p, _, e, k in CASES],
                         ids=[case for _, case, _, _ in CASES])
def test_bad_config_names_source_and_key(preset: str, edit: Edit, key: str) -> None:
    config = copy.deepcopy(load_preset_config(preset))
    edit(config)
    with pytest.raises(ConfigError) as info:
        Layout.from_hf_config(config, name="bad", source="bad.json")
    assert (info.value.key, info.value.source) == (key, "bad.json")
    assert info.value.fields == {"source": "bad.json", "key": key}


def test_config_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError) as info:
        Layout.from_hf_config([1, 2], name="x")  # type: ignore[arg-type]
    assert (info.value.key, info.value.source) == ("<root>", "x")


def test_block_tokens_keyword_is_validated() -> None:
    with pytest.raises(ConfigError) as info:
        Layout.from_preset("tiny_v4", block_tokens=0)
    assert (info.value.key, info.value.source) == ("block_tokens", "tiny_v4")


def test_unknown_preset_lists_the_available_ones() -> None:
    with pytest.raises(ConfigError) as info:
        Layout.from_preset("deepseek_v5")
    assert info.value.key == "preset" and info.value.source == "deepseek_v5"
    assert "deepseek_v4_flash" in info.value.message and "tiny_v4" in info.value.message
    with pytest.raises(ConfigError):
        load_layout("deepseek_v5")


def test_load_layout_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_layout(str(tmp_path / "missing" / "config.json"))
    assert info.value.key == "path"
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError) as info:
        load_layout(str(broken))
    assert (info.value.key, info.value.source) == ("<file>", str(broken))
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ConfigError) as info:
        load_layout(str(listed))
    assert info.value.key == "<root>"


@pytest.mark.parametrize(("key", "kwargs"), [
    ("name", {"name": None}), ("name", {"name": 123}), ("name", {"name": ""}), ("name", {"name": "  "}),
    ("name", {"name": b"x"}), ("source", {"name": "x", "source": 5}), ("source", {"name": "x", "source": ""}),
], ids=repr)
def test_a_layout_name_is_a_non_empty_string(key: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as info:
        Layout.from_hf_config(load_preset_config("tiny_v4"), **kwargs)
    assert info.value.key == key and info.value.source == "Layout.from_hf_config"
    assert "non-empty str" in info.value.reason
    assert Layout.from_hf_config(load_preset_config("tiny_v4"), name="mine").fingerprint()
