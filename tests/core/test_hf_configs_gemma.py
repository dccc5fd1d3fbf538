"""Gemma 2 and Gemma 3 configs (tests/data/hf_configs/gemma*.json): interleaved sliding and full layers, read
as transformers reads them - its own config classes are the reference where transformers is installed."""

from __future__ import annotations

from typing import Any

import pytest
from test_hf_configs import CONFIGS, fixture, kinds, kv_bytes_per_token, layout_of

from hkv_core.errors import ConfigError
from hkv_core.layout import Layout, ObjectKind
from hkv_core.layout.kinds import DTYPE_BYTES

GEMMA = ["gemma2_9b", "gemma3_12b", "gemma3_1b"]


@pytest.mark.parametrize(("name", "groups", "kv_heads"), [
    ("gemma2_9b", [("SWA", 0, 21, 4096), ("FULL", 1, 21, 0)], 8),
    ("gemma3_12b", [("SWA", 0, 40, 1024), ("FULL", 1, 8, 0)], 8),
    ("gemma3_1b", [("SWA", 0, 22, 512), ("FULL", 1, 4, 0)], 1),
])
def test_gemma_interleaves_sliding_and_full_layers(name: str, groups: list[Any], kv_heads: int) -> None:
    layout = layout_of(name)
    assert kinds(layout) == groups and layout.family == "standard"
    assert (layout.head_dim, layout.num_key_value_heads) == (256, kv_heads)
    layers = sum(g[2] for g in groups)
    window_layers = groups[0][2]
    per_token = (layers - window_layers) * 2 * kv_heads * 256 * DTYPE_BYTES[layout.kv_dtype]
    assert layout.bytes_per_token(ObjectKind.COMPRESSED_KV) == per_token  # the full layers' K and V
    assert kv_bytes_per_token(layout) > per_token  # and each sliding layer's window


def test_gemma3_reads_the_text_model_of_a_multimodal_checkpoint_with_transformers_defaults() -> None:
    """gemma-3-12b's file gives no head_dim (hidden_size / heads would be 240), pattern or vocabulary."""
    layout = layout_of("gemma3_12b")
    assert layout.model_type == "gemma3" and layout.head_dim == 256 != 3840 // 16
    assert layout.vocab_size == 262208 and layout.main_layers == 48
    assert layout.group("full").layer_ids == tuple(range(5, 48, 6))


@pytest.mark.parametrize("name", GEMMA)
def test_gemma_layers_are_transformers_layers(name: str) -> None:
    """transformers' own config class says which layer slides, its window and head sizes: hkv agrees."""
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(**fixture(name))
    text = getattr(config, "text_config", config)
    layout = layout_of(name)
    sliding = tuple(i for i, kind in enumerate(text.layer_types) if kind == "sliding_attention")
    assert layout.group("swa").layer_ids == sliding
    assert layout.group("swa").window_tokens == text.sliding_window
    assert (layout.head_dim, layout.num_key_value_heads, layout.num_attention_heads) == (
        text.head_dim, text.num_key_value_heads, text.num_attention_heads)
    assert layout.vocab_size == text.vocab_size


def test_layer_types_when_given_override_the_pattern() -> None:
    config = dict(fixture("gemma3_1b"), layer_types=["full_attention"] * 2 + ["sliding_attention"] * 24)
    layout = Layout.from_hf_config(config, name="g")
    assert layout.group("full").layer_ids == (0, 1)


@pytest.mark.parametrize(("name", "change", "key", "words"), [
    ("gemma2_9b", {"sliding_window_pattern": 6}, "sliding_window_pattern", "alternates"),
    ("gemma3_1b", {"use_bidirectional_attention": True}, "use_bidirectional_attention", "bidirectional"),
    ("gemma3_1b", {"sliding_window_pattern": 0}, "sliding_window_pattern", "must be in"),
    ("gemma3_1b", {"kv_lora_rank": 512}, "kv_lora_rank", "latent"),
    ("gemma3_12b", {"text_config": None}, "text_config", "missing"),
    ("gemma3_12b", {"text_config": [1]}, "text_config", "table"),
])
def test_a_gemma_key_that_contradicts_the_type_is_refused_by_name(name: str, change: dict[str, Any], key: str,
                                                                   words: str) -> None:
    with pytest.raises(ConfigError, match=words) as info:
        Layout.from_hf_config({**fixture(name), **change}, name="g")
    assert info.value.key == key


def test_a_multimodal_text_config_of_another_type_or_with_foreign_keys_is_refused() -> None:
    config = fixture("gemma3_12b")
    other = {**config, "text_config": {**config["text_config"], "model_type": "llama"}}
    with pytest.raises(ConfigError, match="'llama', not 'gemma3_text'") as info:
        Layout.from_hf_config(other, name="g")
    assert info.value.key == "text_config"
    foreign = {**config, "text_config": {**config["text_config"], "compress_ratios": [4] * 48}}
    with pytest.raises(ConfigError, match="compress_ratios") as info:
        Layout.from_hf_config(foreign, name="g")
    assert info.value.key == "compress_ratios" and "(text_config)" in info.value.source


def test_the_fixtures_are_where_the_other_tests_read_them() -> None:
    assert all((CONFIGS / f"{name}.json").is_file() for name in GEMMA)


def test_a_null_window_is_refused_not_defaulted_and_the_text_models_dtype_wins() -> None:
    """A file that says sliding_window: null gets no default (transformers would keep None and fail); a
    multimodal config's text model's own torch_dtype wins over the outer dtype."""
    with pytest.raises(ConfigError, match="missing") as info:
        Layout.from_hf_config({**fixture("gemma3_1b"), "sliding_window": None}, name="g")
    assert info.value.key == "sliding_window"
    config = fixture("gemma3_12b")
    mixed = {**config, "dtype": "float32", "text_config": {**config["text_config"], "torch_dtype": "float16"}}
    assert Layout.from_hf_config(mixed, name="g").kv_dtype == "fp16"
    assert Layout.from_hf_config({**config, "dtype": "float32"}, name="g").kv_dtype == "fp32"
