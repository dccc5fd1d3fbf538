"""Every size a model config gives has an upper limit (hkv_core/layout/bounds.py), checked before any build.

For each bounded key: one past the limit is a ConfigError naming the key; the
limit itself builds a layout (every case here is cheap at its limit).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import pytest

from hkv_core.errors import ConfigError
from hkv_core.layout import Layout, load_preset_config
from hkv_core.layout import bounds as b

Config = dict[str, Any]
Setter = Callable[[Config, int], None]


def key(name: str) -> Setter:
    def put(config: Config, value: int) -> None:
        config[name] = value
    return put


def hkv_key(name: str) -> Setter:
    def put(config: Config, value: int) -> None:
        config.setdefault("hkv", {})[name] = value
    return put


def heads_and_kv_heads(config: Config, value: int) -> None:
    config.update(num_attention_heads=min(value, b.HEADS_MAX), num_key_value_heads=value)


def qwen_window_layers(config: Config, value: int) -> None:
    config.update(use_sliding_window=True, sliding_window=4096, max_window_layers=value)


def last_ratio(config: Config, value: int) -> None:
    config["compress_ratios"] = [0, 4, value]


def gemma_pattern(config: Config, value: int) -> None:
    """gemma3_12b's text model as a gemma3_text config (its own source), every `value`-th layer full."""
    config.update(config.pop("text_config"), model_type="gemma3_text", sliding_window_pattern=value)


def llama_layers(config: Config, value: int) -> None:
    config["num_hidden_layers"] = value


def keys(**fixed: int) -> Callable[[str], Setter]:
    """Set `name` to the value, and the `fixed` keys beside it (None: removed)."""
    def setter(name: str) -> Setter:
        def put(config: Config, value: int) -> None:
            config.update(fixed)
            config[name] = value
            for k in [k for k, v in config.items() if v is None]:
                del config[k]
        return put
    return setter


def kda(name: str) -> Setter:
    def put(config: Config, value: int) -> None:
        config["linear_attn_config"][name] = value
    return put


def kda_layers(name: str) -> Setter:
    """Layers 1..4096 split between the two lists; the last entry of `name` is the value."""
    def put(config: Config, value: int) -> None:
        other = "full_attn_layers" if name == "kda_layers" else "kda_layers"
        config["num_hidden_layers"] = b.LAYERS_MAX
        config["linear_attn_config"].update({other: list(range(1, b.LAYERS_MAX)), name: [value]})
    return put


def qwen_interval(config: Config, value: int) -> None:
    config.update(num_hidden_layers=b.LAYERS_MAX, full_attention_interval=value)


def jamba_period(config: Config, value: int) -> None:
    config.update(num_hidden_layers=b.LAYERS_MAX, attn_layer_period=value, attn_layer_offset=0)


def jamba_offset(config: Config, value: int) -> None:
    config.update(num_hidden_layers=b.LAYERS_MAX, attn_layer_period=b.LAYERS_MAX, attn_layer_offset=value)


# key named in the error -> (preset, how to set it, limit)
BOUNDS: dict[str, tuple[str, Setter, int]] = {
    "num_hidden_layers": ("llama_full", llama_layers, b.LAYERS_MAX),
    "max_window_layers": ("qwen_full", qwen_window_layers, b.LAYERS_MAX),
    "sliding_window_pattern": ("gemma3_12b", gemma_pattern, b.LAYERS_MAX),
    "num_nextn_predict_layers": ("deepseek_v3", key("num_nextn_predict_layers"), b.MTP_LAYERS_MAX),
    "num_attention_heads": ("llama_full", key("num_attention_heads"), b.HEADS_MAX),
    "num_key_value_heads": ("llama_full", heads_and_kv_heads, b.HEADS_MAX),
    "index_n_heads": ("tiny_v4", key("index_n_heads"), b.HEADS_MAX),
    "head_dim": ("llama_full", key("head_dim"), b.HEAD_DIM_MAX),
    "qk_rope_head_dim": ("deepseek_v3", key("qk_rope_head_dim"), b.HEAD_DIM_MAX),
    "qk_nope_head_dim": ("deepseek_v3", key("qk_nope_head_dim"), b.HEAD_DIM_MAX),
    "v_head_dim": ("deepseek_v3", key("v_head_dim"), b.HEAD_DIM_MAX),
    "kv_lora_rank": ("deepseek_v3", key("kv_lora_rank"), b.HEAD_DIM_MAX),
    "index_head_dim": ("tiny_v4", key("index_head_dim"), b.HEAD_DIM_MAX),
    "hidden_size": ("llama_full", key("hidden_size"), b.HIDDEN_SIZE_MAX),
    "sliding_window": ("mistral_swa", key("sliding_window"), b.WINDOW_TOKENS_MAX),
    "compress_ratios": ("tiny_v4", last_ratio, b.COMPRESS_RATIO_MAX),
    "index_topk": ("tiny_v4", key("index_topk"), b.INDEX_TOPK_MAX),
    "vocab_size": ("llama_full", key("vocab_size"), b.VOCAB_SIZE_MAX),
    "hkv.block_tokens": ("llama_full", hkv_key("block_tokens"), b.BLOCK_TOKENS_MAX),
    "hkv.alignment_bytes": ("tiny_v4", hkv_key("alignment_bytes"), b.ALIGNMENT_BYTES_MAX),
    # linear-attention / state-space hybrids (each at its limit still within one layer's state bytes limit)
    "full_attention_interval": ("qwen3_next_80b", qwen_interval, b.LAYERS_MAX),
    "linear_num_key_heads": ("qwen3_next_80b", keys(linear_num_value_heads=b.HEADS_MAX)("linear_num_key_heads"),
                             b.HEADS_MAX),
    "linear_num_value_heads": ("qwen3_next_80b", keys(linear_num_key_heads=1)("linear_num_value_heads"),
                               b.HEADS_MAX),
    "linear_key_head_dim": ("qwen3_next_80b", keys(linear_num_key_heads=1, linear_num_value_heads=1)(
        "linear_key_head_dim"), b.HEAD_DIM_MAX),
    "linear_value_head_dim": ("qwen3_next_80b", keys(linear_num_key_heads=1, linear_num_value_heads=1)(
        "linear_value_head_dim"), b.HEAD_DIM_MAX),
    "linear_conv_kernel_dim": ("qwen3_next_80b", key("linear_conv_kernel_dim"), b.CONV_KERNEL_MAX),
    "linear_attn_config.kda_layers": ("kimi_linear_48b", kda_layers("kda_layers"), b.LAYERS_MAX),
    "linear_attn_config.full_attn_layers": ("kimi_linear_48b", kda_layers("full_attn_layers"), b.LAYERS_MAX),
    "linear_attn_config.num_heads": ("kimi_linear_48b", kda("num_heads"), b.HEADS_MAX),
    "linear_attn_config.short_conv_kernel_size": ("kimi_linear_48b", kda("short_conv_kernel_size"),
                                                  b.CONV_KERNEL_MAX),
    "attn_layer_period": ("jamba_mini", jamba_period, b.LAYERS_MAX),
    "attn_layer_offset": ("jamba_mini", jamba_offset, b.LAYERS_MAX - 1),
    "mamba_d_conv": ("jamba_mini", key("mamba_d_conv"), b.CONV_KERNEL_MAX),
    "mamba_expand": ("granite_4_h_small", keys(mamba_d_head=None)("mamba_expand"), b.EXPAND_MAX),
    "mamba_n_heads": ("granite_4_h_small", keys(mamba_d_head=None)("mamba_n_heads"), b.HEADS_MAX),
    "mamba_n_groups": ("granite_4_h_small", keys(mamba_d_head=None, mamba_n_heads=b.HEADS_MAX)("mamba_n_groups"),
                       b.HEADS_MAX),
    "mamba_d_head": ("granite_4_h_small", keys(mamba_n_heads=1, mamba_expand=16)("mamba_d_head"), b.HEAD_DIM_MAX),
    "mamba_d_state": ("granite_4_h_small", keys(hidden_size=1024, mamba_d_head=None)("mamba_d_state"),
                      b.STATE_DIM_MAX),
}
PREFIXES = ("hkv.", "linear_attn_config.")


def config_with(name: str, value: int) -> Config:
    preset, put, _ = BOUNDS[name]
    config = copy.deepcopy(load_preset_config(preset))
    put(config, value)
    return config


def test_every_bounded_key_is_tested() -> None:
    assert {_bare(name) for name in BOUNDS} == set(b.KEY_MAXIMUM)
    assert all(b.KEY_MAXIMUM[_bare(name)] == limit for name, (_, _, limit) in BOUNDS.items())


def _bare(name: str) -> str:
    for prefix in PREFIXES:
        name = name.removeprefix(prefix)
    return name


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_one_past_the_limit_is_refused_naming_the_key(name: str) -> None:
    limit = BOUNDS[name][2]
    with pytest.raises(ConfigError) as info:
        Layout.from_hf_config(config_with(name, limit + 1), name="big", source="big.json")
    assert (info.value.key, info.value.source) == (name, "big.json")
    assert str(limit) in info.value.message and "hkv's limit" in info.value.message


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_the_limit_itself_builds(name: str) -> None:
    layout = Layout.from_hf_config(config_with(name, BOUNDS[name][2]), name="big")
    assert layout.pools and layout.main_layers >= 1


def test_limits_reach_the_layout() -> None:
    layout = Layout.from_hf_config(config_with("num_hidden_layers", b.LAYERS_MAX), name="deep")
    assert layout.main_layers == b.LAYERS_MAX == layout.groups[0].layer_count
    wide = Layout.from_hf_config(config_with("kv_lora_rank", b.HEAD_DIM_MAX), name="wide")
    assert wide.pools[0].entry_shape == (b.HEAD_DIM_MAX + 64,)


def test_block_tokens_keyword_is_bounded() -> None:
    with pytest.raises(ConfigError) as info:
        Layout.from_preset("llama_full", block_tokens=b.BLOCK_TOKENS_MAX + 1)
    assert info.value.key == "block_tokens"
    assert Layout.from_preset("llama_full", block_tokens=b.BLOCK_TOKENS_MAX).block_tokens == b.BLOCK_TOKENS_MAX


@pytest.mark.parametrize(("preset", "key_name"), [("deepseek_v4_flash", "compress_ratios"),
                                                  ("swa_full", "layer_types")])
def test_a_per_layer_list_is_bounded_before_its_entries_are_read(preset: str, key_name: str) -> None:
    config = copy.deepcopy(load_preset_config(preset))
    config[key_name] = [None] * (b.LAYER_LIST_ITEMS_MAX + 1)  # entries that would fail if they were read
    with pytest.raises(ConfigError) as info:
        Layout.from_hf_config(config, name="long")
    assert info.value.key == key_name and f"at most {b.LAYER_LIST_ITEMS_MAX}" in info.value.message


@pytest.mark.parametrize("preset", ["deepseek_v4_flash", "deepseek_v3", "llama_full", "swa_full", "mistral_swa"])
def test_a_billion_layers_is_refused_at_once(preset: str) -> None:
    config = copy.deepcopy(load_preset_config(preset))
    config["num_hidden_layers"] = 10**9
    started = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        Layout.from_hf_config(config, name="huge")
    assert time.perf_counter() - started < 0.5  # it once ran 15 minutes and took 24 GB
    assert info.value.key == "num_hidden_layers" and "1000000000" in info.value.message


def test_the_largest_layout_builds_quickly() -> None:
    config = copy.deepcopy(load_preset_config("deepseek_v4_flash"))
    config.update(num_hidden_layers=b.LAYERS_MAX, num_nextn_predict_layers=b.MTP_LAYERS_MAX,
                  compress_ratios=[0, 4, 8, 128] * (b.LAYERS_MAX // 4) + [4] * b.MTP_LAYERS_MAX)
    started = time.perf_counter()
    layout = Layout.from_hf_config(config, name="largest")
    assert time.perf_counter() - started < 5.0  # about 15 ms on one core
    assert layout.main_layers + layout.mtp_layers == b.LAYER_LIST_ITEMS_MAX
    assert [g.layer_count for g in layout.groups] == [b.LAYERS_MAX // 4] * 4
