"""The Hugging Face ``model_type`` values hkv reads, and what each one's config must not carry.

``MODEL_TYPES`` is the one table of supported types (``docs/models.md`` lists
it): each names a cache family and, for the standard family, where its
sliding windows come from.  A config is read by its ``model_type`` alone,
never guessed from which keys happen to be present.
"""

from __future__ import annotations

from enum import StrEnum

import attrs

from hkv_core.layout.recurrent import RECURRENT_RULES, foreign_recurrent_keys


class Family(StrEnum):
    """How a model caches K and V (``Layout.family``)."""

    DEEPSEEK_V4 = "deepseek_v4"  # per-layer compress_ratios: SWA / CSA / HCA, one latent, a window on every layer
    MLA = "mla"  # multi-head latent attention: one kv_lora_rank + qk_rope_head_dim latent per token
    STANDARD = "standard"  # MHA / GQA / MQA: K and V per KV head, full or sliding-window layers


class Sliding(StrEnum):
    """Where a standard-family config says which layers use a sliding window."""

    NONE = "none"  # every layer is full attention
    EVERY_LAYER = "every_layer"  # sliding_window, when set, applies to every layer (Mistral)
    LAYER_TYPES = "layer_types"  # layer_types names each layer sliding or full (gpt-oss)
    QWEN = "qwen"  # layer_types, else use_sliding_window: layers >= max_window_layers slide
    ALTERNATE = "alternate"  # layer_types, else even layers slide and odd ones are full (Gemma 2)
    PATTERN = "pattern"  # layer_types, else every sliding_window_pattern-th layer is full, the rest slide (Gemma 3)


@attrs.frozen
class ModelType:
    """One supported ``model_type``: its family and, for the standard family, its sliding rule.

    ``defaults``: the values transformers' config class gives keys a published ``config.json`` leaves out
    (read as if the file had them: Gemma 3's files omit ``head_dim``, and hidden_size / heads is not it).
    ``text_config``: the type wraps a text model's config in ``text_config`` (Gemma 3's multimodal
    checkpoints), of the type named here; hkv reads that one.
    """

    family: Family
    sliding: Sliding = Sliding.NONE
    defaults: tuple[tuple[str, object], ...] = ()
    text_config: str = ""
    indexer: bool = False  # an MLA type whose every layer keeps a lightning-indexer key per token (V3.2)
    recurrent: bool = False  # a hybrid: some layers keep a recurrent state (hkv_core/layout/recurrent.py)


# transformers' Gemma2Config / Gemma3TextConfig defaults for the keys hkv reads
_GEMMA2_DEFAULTS = (("head_dim", 256), ("num_attention_heads", 8), ("num_key_value_heads", 4),
                    ("sliding_window", 4096), ("vocab_size", 256000))
_GEMMA3_DEFAULTS = (("head_dim", 256), ("num_attention_heads", 8), ("num_key_value_heads", 4),
                    ("sliding_window", 4096), ("sliding_window_pattern", 6), ("vocab_size", 262208))


MODEL_TYPES: dict[str, ModelType] = {
    "deepseek_v4": ModelType(Family.DEEPSEEK_V4),
    "deepseek_v2": ModelType(Family.MLA),
    "deepseek_v3": ModelType(Family.MLA),  # also DeepSeek-R1
    "kimi_k2": ModelType(Family.MLA),
    "deepseek_v32": ModelType(Family.MLA, indexer=True),  # DeepSeek-V3.2: MLA + a sparse-attention indexer
    "llama": ModelType(Family.STANDARD),
    "mistral": ModelType(Family.STANDARD, Sliding.EVERY_LAYER),
    "mixtral": ModelType(Family.STANDARD, Sliding.EVERY_LAYER),
    "qwen2": ModelType(Family.STANDARD, Sliding.QWEN),
    "qwen3": ModelType(Family.STANDARD, Sliding.QWEN),
    "qwen3_moe": ModelType(Family.STANDARD, Sliding.QWEN),
    "gpt_oss": ModelType(Family.STANDARD, Sliding.LAYER_TYPES),
    "gemma2": ModelType(Family.STANDARD, Sliding.ALTERNATE, _GEMMA2_DEFAULTS),
    "gemma3_text": ModelType(Family.STANDARD, Sliding.PATTERN, _GEMMA3_DEFAULTS),
    "gemma3": ModelType(Family.STANDARD, Sliding.PATTERN, _GEMMA3_DEFAULTS, text_config="gemma3_text"),
    # linear-attention / state-space hybrids: their attention layers are full attention of the family named
    "qwen3_next": ModelType(Family.STANDARD, recurrent=True),  # Gated DeltaNet + gated full attention
    "kimi_linear": ModelType(Family.MLA, recurrent=True),  # Kimi Delta Attention + MLA
    "jamba": ModelType(Family.STANDARD, recurrent=True),  # Mamba + attention
    "granitemoehybrid": ModelType(Family.STANDARD, recurrent=True),  # Granite 4.0-H: Mamba-2 + attention
}

_V4_KEYS = {
    "compress_ratios": "per-layer compression belongs to deepseek_v4",
    "compress_ratio": "not a known config key; deepseek_v4 uses compress_ratios",
    "index_n_heads": "the lightning indexer belongs to deepseek_v4 and deepseek_v32",
    "index_head_dim": "the lightning indexer belongs to deepseek_v4 and deepseek_v32",
    "index_topk": "the lightning indexer belongs to deepseek_v4 and deepseek_v32",
}
_MLA_KEYS = {"kv_lora_rank": "a latent KV cache belongs to the MLA types (deepseek_v2, deepseek_v3, kimi_k2)"}
_SLIDING_KEYS = {
    "sliding_window": "this type has no sliding-window layers",
    "layer_types": "this type has no per-layer attention types",
}

# Keys whose (non-null) presence contradicts a family: hkv would ignore them and misread the model.
FOREIGN_KEYS: dict[Family, dict[str, str]] = {
    Family.DEEPSEEK_V4: {**_MLA_KEYS, "compress_ratio": _V4_KEYS["compress_ratio"],
                         "layer_types": "deepseek_v4 layers are typed by compress_ratios"},
    Family.MLA: {**_V4_KEYS, **_SLIDING_KEYS},
    Family.STANDARD: {**_V4_KEYS, **_MLA_KEYS},
}
# Further keys a standard-family type's sliding rule refuses.
SLIDING_FOREIGN_KEYS: dict[Sliding, dict[str, str]] = {
    Sliding.NONE: _SLIDING_KEYS,
    Sliding.EVERY_LAYER: {"layer_types": "this type's sliding_window applies to every layer"},
    Sliding.LAYER_TYPES: {},
    Sliding.QWEN: {},
    Sliding.ALTERNATE: {"sliding_window_pattern": "Gemma 2 alternates sliding and full layers; the pattern is "
                                                  "Gemma 3's"},
    Sliding.PATTERN: {},
}

assert set(SLIDING_FOREIGN_KEYS) == set(Sliding) and set(FOREIGN_KEYS) == set(Family)
assert all(t.sliding is Sliding.NONE for t in MODEL_TYPES.values() if t.family is not Family.STANDARD)


# Hybrid types hkv knows and does not read yet, with what they have that the layout cannot say: Nemotron-H's MLP-only
# layers keep no state at all, Falcon-H1's layers run attention and Mamba-2 side by side in one layer.
RECURRENT_MODEL_TYPES: dict[str, str] = {
    "nemotron_h": "Mamba-2 layers and MLP-only layers that keep no state",
    "falcon_h1": "Mamba-2 heads beside attention in the same layer",
    "bamba": "Mamba-2 layers",
}
assert not set(RECURRENT_MODEL_TYPES) & set(MODEL_TYPES)
assert {name for name, t in MODEL_TYPES.items() if t.recurrent} == set(RECURRENT_RULES)


def supported_model_types() -> str:
    """The supported ``model_type`` values, comma separated (for messages)."""
    return ", ".join(sorted(MODEL_TYPES))


def foreign_keys(model_type: ModelType, name: str = "") -> dict[str, str]:
    """The keys a config of ``model_type`` (called ``name``) must not carry, with why."""
    recurrent = foreign_recurrent_keys(name)
    if model_type.recurrent:  # layer_types is the rule's to read or refuse; no sliding window
        own = {key: why for key, why in _family_foreign(model_type).items() if key != "layer_types"}
        return {**own, **recurrent, "sliding_window": "this type has no sliding-window layers"}
    return {**_family_foreign(model_type), **recurrent}


def _family_foreign(model_type: ModelType) -> dict[str, str]:
    if model_type.indexer:  # the indexer's keys are this type's own, not V4's; layer_types is read (geometry.py)
        return {key: why for key, why in FOREIGN_KEYS[model_type.family].items()
                if not key.startswith("index_") and key != "layer_types"}
    if model_type.family is not Family.STANDARD:
        return FOREIGN_KEYS[model_type.family]
    return {**FOREIGN_KEYS[model_type.family], **SLIDING_FOREIGN_KEYS[model_type.sliding]}
