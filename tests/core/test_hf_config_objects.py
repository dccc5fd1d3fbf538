"""`Layout.from_hf_config` reads transformers config objects and config.json paths, not only dicts.

A DeepSeek-V4 config object names its layers by `layer_types` and a `compress_rates` table (transformers'
names); hkv_core.layout.hf_source turns them into the checkpoints' `compress_ratios`, so the object and the
equivalent config.json give the same layout.  transformers is the `hf` extra (installed by the test command).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hkv_core.errors import ConfigError
from hkv_core.layout import Layout

transformers = pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

V4_TYPES = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]
V4_SIZES: dict[str, Any] = dict(
    vocab_size=64, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
    num_key_value_heads=1, head_dim=16, qk_rope_head_dim=8, q_lora_rank=16, sliding_window=8,
    index_n_heads=2, index_head_dim=8, index_topk=4, num_nextn_predict_layers=0, dtype="float32")
RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}


def v4_object(**changes: Any) -> Any:
    return transformers.DeepseekV4Config(**{**V4_SIZES, "layer_types": V4_TYPES, "compress_rates": RATES,
                                            **changes})


def v4_json() -> dict[str, Any]:
    return {**V4_SIZES, "model_type": "deepseek_v4", "compress_ratios": [0, 4, 8]}


def pools(layout: Layout) -> list[tuple[str, str, tuple[int, ...], int]]:
    return [(p.name, p.dtype, p.entry_shape, p.entries_per_page) for p in layout.pools]


def test_a_deepseek_v4_object_gives_the_layout_of_its_config_json(tmp_path: Path) -> None:
    from_object = Layout.from_hf_config(v4_object(), name="tiny", block_tokens=8)
    from_dict = Layout.from_hf_config(v4_json(), name="tiny", block_tokens=8)
    (tmp_path / "config.json").write_text(json.dumps(v4_json()))
    from_path = Layout.from_hf_config(tmp_path / "config.json", name="tiny", block_tokens=8)
    from_dir = Layout.from_hf_config(str(tmp_path), name="tiny", block_tokens=8)
    assert pools(from_object) == pools(from_dict) == pools(from_path) == pools(from_dir)
    assert [g.compress_ratio for g in from_object.groups] == [0, 4, 8]
    assert {p.dtype for p in from_object.pools} == {"fp32"}
    kinds = {p.name for p in from_object.pools}
    assert {"csa.indexer_state.keys", "csa.compressor_tail", "hca.compressor_tail"} <= kinds


def test_a_llama_object_gives_one_full_attention_group() -> None:
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64, dtype="float32")
    layout = Layout.from_hf_config(config, name="llama", block_tokens=8)
    assert [(p.name, p.entry_shape) for p in layout.pools] == [("full.compressed_kv", (2, 2, 8))]


def test_a_layer_type_without_a_rate_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="compress_rates") as info:
        Layout.from_hf_config(v4_object(compress_rates={"compressed_sparse_attention": 4}), name="tiny")
    assert info.value.fields["key"] == "compress_rates"


def test_an_object_without_to_dict_or_a_missing_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mapping"):
        Layout.from_hf_config(object(), name="x")
    with pytest.raises(ConfigError, match="no such config file"):
        Layout.from_hf_config(tmp_path / "missing.json", name="x")
