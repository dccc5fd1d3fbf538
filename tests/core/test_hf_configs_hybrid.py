"""Linear-attention and state-space hybrids read from real-shaped config.json files (tests/data/hf_configs/).

Every figure below is computed by hand from the published config, not by hkv: which layers are recurrent, the
shape of each one's convolution and recurrent state (the convolution keeps its last kernel - 1 inputs), and the
bytes of a resume point's recurrent state (convolution in the model dtype, recurrent state in fp32).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from hkv_core.errors import ConfigError
from hkv_core.layout import EntryKind, Layout, ObjectKind, resume_requirements
from hkv_core.layout.model_types import RECURRENT_MODEL_TYPES

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hf_configs"
BF16, FP32 = 2, 4


def fixture(name: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return config


def layout_of(name: str, config: dict[str, Any] | None = None) -> Layout:
    return Layout.from_hf_config(fixture(name) if config is None else config, name=name)


# name -> (linear layer ids, conv shape, ssm shape, attention K/V (or latent) bytes per token and layer)
EXPECTED: dict[str, tuple[set[int], tuple[int, ...], tuple[int, ...], int]] = {
    # 48 layers, (i + 1) % 4 == 0 full; conv 2 * 16 * 128 + 32 * 128 = 8192 channels; K and V of 2 heads of 256
    "qwen3_next_80b_a3b": ({i for i in range(48) if (i + 1) % 4}, (8192, 3), (32, 128, 128), 2 * 2 * 256 * BF16),
    # 1-based kda_layers; q, k and v conv 3 * 32 * 128 = 12288 channels; MLA latent 512 + 64
    "kimi_linear_48b_a3b": (set(range(27)) - {3, 7, 11, 15, 19, 23, 26}, (12288, 3), (32, 128, 128),
                            (512 + 64) * BF16),
    # attention where i % 8 == 4; Mamba-1 intermediate 2 * 4096; 8 KV heads of 4096 / 32 = 128
    "jamba_mini_1_7": ({i for i in range(32) if i % 8 != 4}, (8192, 3), (8192, 16), 2 * 8 * 128 * BF16),
    # layer_types: attention at 5, 15, 25, 35; Mamba-2 conv 8192 + 2 * 1 * 128; 128 heads of 64, d_state 128
    "granite_4_h_small": (set(range(40)) - {5, 15, 25, 35}, (8448, 3), (128, 64, 128), 2 * 8 * 128 * BF16),
}
STATE_BYTES_PER_LAYER = {  # conv in bf16 + recurrent state in fp32, by hand
    "qwen3_next_80b_a3b": 8192 * 3 * BF16 + 32 * 128 * 128 * FP32,  # 49,152 + 2,097,152 = 2,146,304
    "kimi_linear_48b_a3b": 12288 * 3 * BF16 + 32 * 128 * 128 * FP32,  # 73,728 + 2,097,152 = 2,170,880
    "jamba_mini_1_7": 8192 * 3 * BF16 + 8192 * 16 * FP32,  # 49,152 + 524,288 = 573,440
    "granite_4_h_small": 8448 * 3 * BF16 + 128 * 64 * 128 * FP32,  # 50,688 + 4,194,304 = 4,244,992
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hybrid_fixture_reads_its_recurrent_layers_and_state(name: str) -> None:
    linear, conv, ssm, kv_bytes = EXPECTED[name]
    layout = layout_of(name)
    groups = {g.kind.value: g for g in layout.groups}
    assert set(groups) == {"FULL", "LINEAR"}
    assert set(groups["LINEAR"].layer_ids) == linear
    assert set(groups["FULL"].layer_ids) == set(range(layout.main_layers)) - linear
    state = groups["LINEAR"].state
    assert state is not None and (state.conv_shape, state.ssm_shape) == (conv, ssm)
    assert (state.conv_dtype, state.ssm_dtype) == ("bf16", "fp32")
    assert state.bytes_per_layer == STATE_BYTES_PER_LAYER[name]
    pools = {p.entry_kind: p for p in layout.pools if p.object_kind is ObjectKind.RECURRENT_STATE}
    assert pools[EntryKind.CONV_STATE].entry_shape == conv and pools[EntryKind.SSM_STATE].entry_shape == ssm
    assert {p.layer_count for p in pools.values()} == {len(linear)}
    full_layers = layout.main_layers - len(linear)
    assert layout.bytes_per_token(ObjectKind.COMPRESSED_KV) == full_layers * kv_bytes
    assert layout.bytes_per_token(ObjectKind.RECURRENT_STATE) == 0  # the state does not grow with the tokens
    assert layout.recurrent_state_bytes() == len(linear) * STATE_BYTES_PER_LAYER[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_resume_point_needs_the_whole_state_once(name: str) -> None:
    layout = layout_of(name)
    at_zero, at_p = resume_requirements(layout, 0), resume_requirements(layout, 1000)
    linear = next(g for g in at_p.groups if g.kind.value == "LINEAR")
    assert linear.state_entries == 1 and next(g for g in at_zero.groups if g.kind.value == "LINEAR").state_entries == 0
    full = next(g for g in at_p.groups if g.kind.value == "FULL")
    assert at_p.bytes == full.bytes + layout.recurrent_state_bytes()
    assert resume_requirements(layout, 5000).bytes - at_p.bytes == 4000 * layout.bytes_per_token(
        ObjectKind.COMPRESSED_KV)  # only the per-token KV grows


def test_presets_equal_their_fixtures() -> None:
    for preset, name in [("qwen3_next_80b", "qwen3_next_80b_a3b"), ("kimi_linear_48b", "kimi_linear_48b_a3b"),
                         ("jamba_mini", "jamba_mini_1_7"), ("granite_4_h_small", "granite_4_h_small")]:
        a, b = Layout.from_preset(preset), layout_of(name)
        assert [(g.kind, g.layer_ids, g.state) for g in a.groups] == [(g.kind, g.layer_ids, g.state) for g in b.groups]
        assert [p.entry_shape for p in a.pools] == [p.entry_shape for p in b.pools]


def test_the_state_dtype_is_an_hkv_option() -> None:
    config = dict(fixture("qwen3_next_80b_a3b"), hkv={"ssm_state_dtype": "bfloat16"})
    state = next(g.state for g in layout_of("x", config).groups if g.state is not None)
    assert state.ssm_dtype == "bf16" and state.bytes_per_layer == 8192 * 3 * BF16 + 32 * 128 * 128 * BF16
    with pytest.raises(ConfigError) as info:
        layout_of("x", dict(fixture("qwen3_next_80b_a3b"), hkv={"ssm_state_dtype": "int4"}))
    assert info.value.key == "hkv.ssm_state_dtype"
    with pytest.raises(ConfigError) as info:  # an attention-only model keeps no recurrent state
        Layout.from_hf_config(dict(fixture("llama3_1_8b"), hkv={"ssm_state_dtype": "fp32"}), name="x")
    assert info.value.key == "hkv.ssm_state_dtype"


def test_qwen3_next_layer_types_win_over_the_interval() -> None:
    config = fixture("qwen3_next_80b_a3b")
    config["layer_types"] = ["full_attention"] + ["linear_attention"] * 47
    layout = layout_of("x", config)
    assert next(g for g in layout.groups if g.kind.value == "FULL").layer_ids == (0,)


# ----------------------------------------------------------------- refusals, each naming its key


def _with(name: str, **changes: Any) -> dict[str, Any]:
    config = copy.deepcopy(fixture(name))
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return config


REFUSED = [
    # a key of another hybrid type, or of a family the type is not
    ("qwen3_next_80b_a3b", {"mamba_d_state": 16}, "mamba_d_state"),
    ("qwen3_next_80b_a3b", {"kv_lora_rank": 512}, "kv_lora_rank"),
    ("qwen3_next_80b_a3b", {"sliding_window": 4096}, "sliding_window"),
    ("jamba_mini_1_7", {"mamba_n_heads": 128}, "mamba_n_heads"),
    ("jamba_mini_1_7", {"layer_types": ["mamba"] * 32}, "layer_types"),
    ("granite_4_h_small", {"attn_layer_period": 8}, "attn_layer_period"),
    ("kimi_linear_48b_a3b", {"full_attention_interval": 4}, "full_attention_interval"),
    # typos and contradictions within the type
    ("qwen3_next_80b_a3b", {"linear_num_value_heads": 24}, "linear_num_value_heads"),  # not a multiple of 16
    ("qwen3_next_80b_a3b", {"layer_types": ["linear_attention"] * 47 + ["full_atention"]}, "layer_types"),
    ("qwen3_next_80b_a3b", {"layer_types": ["linear_attention"] * 48}, "layer_types"),  # no attention layer
    ("qwen3_next_80b_a3b", {"linear_conv_kernel_dim": 1}, "linear_conv_kernel_dim"),
    ("qwen3_next_80b_a3b", {"linear_key_head_dim": None}, "linear_key_head_dim"),
    ("jamba_mini_1_7", {"attn_layer_offset": 8}, "attn_layer_offset"),
    ("granite_4_h_small", {"layer_types": None}, "layer_types"),  # transformers would make every layer Mamba
    ("granite_4_h_small", {"mamba_d_head": 65}, "mamba_n_heads"),  # 128 x 65 is not 2 x 4096
    ("granite_4_h_small", {"mamba_n_groups": 3}, "mamba_n_groups"),  # 3 groups cannot share 128 heads
    ("granite_4_h_small", {"layer_types": ["mamba"] * 39}, "layer_types"),
    ("granite_4_h_small", {"mamba_d_state": 0}, "mamba_d_state"),
]


@pytest.mark.parametrize(("name", "changes", "key"), REFUSED, ids=[f"{n}-{k}" for n, _, k in REFUSED])
def test_a_contradicting_or_mistyped_key_is_refused_by_name(name: str, changes: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        layout_of(name, _with(name, **changes))
    assert info.value.key == key, info.value.message


def test_kimi_layer_lists_must_split_the_layers() -> None:
    config = fixture("kimi_linear_48b_a3b")
    config["linear_attn_config"]["kda_layers"].append(4)  # layer 4 both KDA and MLA
    with pytest.raises(ConfigError) as info:
        layout_of("x", config)
    assert info.value.key == "linear_attn_config.kda_layers"


def test_a_hybrid_key_on_an_attention_model_is_refused() -> None:
    config = dict(fixture("llama3_1_8b"), linear_conv_kernel_dim=4)
    with pytest.raises(ConfigError) as info:
        Layout.from_hf_config(config, name="x")
    assert info.value.key == "linear_conv_kernel_dim" and "no such layers" in info.value.message


@pytest.mark.parametrize("name", ["nemotron_h_8b", "falcon_h1_7b"])
def test_hybrids_hkv_cannot_lay_out_yet_are_refused_saying_what(name: str) -> None:
    config = fixture(name)
    with pytest.raises(ConfigError) as info:
        Layout.from_hf_config(config, name=name)
    assert info.value.key == "model_type" and RECURRENT_MODEL_TYPES[config["model_type"]] in info.value.message


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_transformers_config_objects_read_like_their_files(name: str) -> None:
    """A config object (to_dict()) of each type: Granite's layer names as transformers renames them, Kimi's
    keys derived from linear_attn_config, read to the same layout as the file."""
    transformers = pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
    config = transformers.AutoConfig.for_model(**fixture(name))
    a, b = Layout.from_hf_config(config, name=name), layout_of(name)
    assert [(g.kind, g.layer_ids, g.state) for g in a.groups] == [(g.kind, g.layer_ids, g.state) for g in b.groups]


def test_kimi_derived_keys_that_contradict_the_table_are_refused() -> None:
    transformers = pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
    config = transformers.AutoConfig.for_model(**fixture("kimi_linear_48b_a3b"))
    data = config.to_dict()
    data["linear_conv_kernel_dim"] = 5

    class Obj:
        def to_dict(self) -> dict[str, Any]:
            return data

    with pytest.raises(ConfigError) as info:
        Layout.from_hf_config(Obj(), name="x")
    assert info.value.key == "linear_conv_kernel_dim"
