"""What `Layout.from_hf_config` reads: a config.json-style mapping, the path of a config.json, or a Hugging Face
config object (anything with `to_dict()`, such as `transformers.DeepseekV4Config`; transformers is never
imported here).

A config object's dict is translated where transformers names things differently from the checkpoints'
config.json (docs/models.md): DeepSeek-V4's per-layer `layer_types` with a `compress_rates` table become the
`compress_ratios` list (sliding_attention: 0, every other type: its rate); `dtype: None` (the object's default)
is dropped, so the stored dtype falls back to the config's `torch_dtype` or bf16; Kimi Linear's keys derived
from `linear_attn_config` (its top-level `linear_*` keys and `layer_types`) are checked against it and dropped.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hkv_core.errors import ConfigError
from hkv_core.layout.presets import load_config_file

__all__ = ["SLIDING_LAYER_TYPE", "config_mapping"]

SLIDING_LAYER_TYPE = "sliding_attention"  # transformers' name of a DeepSeek-V4 layer without a compressor


def config_mapping(config: object, source: str) -> Mapping[str, Any] | object:
    """`config` as the mapping parse_config reads (anything else is returned as is, for its ConfigError)."""
    if isinstance(config, Mapping):
        return config
    if isinstance(config, str | os.PathLike):
        return load_config_file(Path(config))
    to_dict = getattr(config, "to_dict", None)
    if not callable(to_dict):
        return config
    data = to_dict()
    if not isinstance(data, dict):
        raise ConfigError(f"to_dict() returned {type(data).__name__}, not a dict", source=source, key="<root>")
    return _translated(dict(data), source)


def _translated(data: dict[str, Any], source: str) -> dict[str, Any]:
    if data.get("dtype") is None:
        data.pop("dtype", None)
    if data.get("model_type") == "deepseek_v4" and "compress_ratios" not in data and "layer_types" in data:
        types, rates = data.pop("layer_types"), data.pop("compress_rates", None) or {}
        if not isinstance(types, list | tuple) or not isinstance(rates, Mapping):
            raise ConfigError("layer_types must be a list and compress_rates a table", source=source,
                              key="layer_types")
        unknown = sorted({t for t in types if t != SLIDING_LAYER_TYPE and t not in rates})
        if unknown:
            raise ConfigError(f"layer types {unknown} have no entry in compress_rates {dict(rates)}",
                              source=source, key="compress_rates")
        data["compress_ratios"] = [0 if t == SLIDING_LAYER_TYPE else rates[t] for t in types]
    if data.get("model_type") == "kimi_linear":
        _kimi_derived(data, source)
    return data


# transformers' KimiLinearConfig writes these beside linear_attn_config, derived from it (checkpoints do not)
KIMI_DERIVED = {"linear_conv_kernel_dim": "short_conv_kernel_size", "linear_num_heads": "num_heads",
                "linear_head_dim": "head_dim"}


def _kimi_derived(data: dict[str, Any], source: str) -> None:
    """Drop the keys KimiLinearConfig derives from `linear_attn_config`, each checked against it."""
    table = data.get("linear_attn_config")
    if not isinstance(table, Mapping):
        return
    for key, inner in KIMI_DERIVED.items():
        if key in data and data[key] != table.get(inner):
            raise ConfigError(f"{data[key]!r} contradicts linear_attn_config.{inner} = {table.get(inner)!r}",
                              source=source, key=key)
        data.pop(key, None)
    types, kda = data.get("layer_types"), table.get("kda_layers")
    if types is not None:
        expected = (None if not isinstance(kda, list | tuple) or not isinstance(types, list | tuple) else
                    ["linear_attention" if i + 1 in kda else "full_attention" for i in range(len(types))])
        if types != expected:
            raise ConfigError("layer_types contradicts linear_attn_config.kda_layers", source=source,
                              key="layer_types")
        data.pop("layer_types")
