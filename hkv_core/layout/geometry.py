"""The family-specific part of a model config: what one token stores in each layer.

- DeepSeek-V4: every layer keeps a sliding window of ``sliding_window``
  tokens; its compress ratio picks SWA / CSA / HCA (/ FULL for r = 1).  K and
  V are one shared latent of ``head_dim`` values.
- MLA (DeepSeek-V2/V3/R1, Kimi-K2): one shared latent of ``kv_lora_rank +
  qk_rope_head_dim`` values per token and layer, full attention everywhere.
- standard (MHA / GQA / MQA): K and V per KV head; each layer full or sliding,
  as the type's ``Sliding`` rule reads it.

FULL layers store their raw K / V as ``compressed_kv`` entries with compress
ratio 1 (the identity compressor: one entry per token, no tail, no window);
MTP layers of the MLA and standard families are FULL too.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from hkv_core import units
from hkv_core.layout.bounds import HEAD_DIM_MAX
from hkv_core.layout.model_types import Family, ModelType, Sliding
from hkv_core.layout.reader import ConfigReader
from hkv_core.layout.records import RecurrentShape

INDEX_KEYS = ("index_n_heads", "index_head_dim", "index_topk")
SLIDING, FULL = "sliding_attention", "full_attention"  # known HF ``layer_types``
INDEXED = "indexed_attention"  # transformers' DeepSeek-V3.2 layer type: MLA with the indexer
FULL_LAYER = (1, units.NO_WINDOW_TOKENS)  # (compress ratio, window tokens) of a FULL layer
MLA_KV_HEADS = 1  # an MLA or V4 layer caches one latent, shared by every head


@attrs.frozen(kw_only=True)
class Geometry:
    """The family-specific part of a config; per-layer tuples list main layers, then MTP.

    ``head_dim`` is the width of one cached KV head (the latent for V4 and MLA).
    """

    family: Family
    num_key_value_heads: int
    head_dim: int
    rope_head_dim: int
    kv_entry_shape: tuple[int, ...]
    window_tokens: int
    layer_ratios: tuple[int, ...]
    layer_windows: tuple[int, ...]
    index: tuple[int, int, int] = (0, 0, 0)  # index_n_heads, index_head_dim, index_topk
    indexed_ratio: int = units.OVERLAP_RATIO  # the layers with the indexer: CSA (V4), full attention (V3.2)
    linear_layers: frozenset[int] = frozenset()  # layers that keep a recurrent state instead of KV (LINEAR)
    state: RecurrentShape | None = None  # what each of them keeps

    def __attrs_post_init__(self) -> None:
        assert bool(self.linear_layers) == (self.state is not None), self


def read_geometry(reader: ConfigReader, model_type: ModelType, layers: tuple[int, int], heads: int,
                  hidden_size: int) -> Geometry:
    """The geometry of a config of ``model_type`` with ``layers`` = (main, MTP) layers."""
    if model_type.family is Family.DEEPSEEK_V4:
        return _v4_geometry(reader, *layers)
    if model_type.family is Family.MLA:
        return _mla_geometry(reader, *layers, indexer=model_type.indexer)
    return _standard_geometry(reader, model_type.sliding, layers, heads, hidden_size)


def _v4_geometry(reader: ConfigReader, main: int, mtp: int) -> Geometry:
    """Geometry of a DeepSeek-V4 config."""
    if reader.integer("num_key_value_heads", minimum=1, default=MLA_KV_HEADS) != MLA_KV_HEADS:
        reader.fail("num_key_value_heads", "deepseek_v4 caches one latent: must be 1 when given")
    ratios = reader.int_list("compress_ratios")
    if len(ratios) not in (main, main + mtp):
        reader.fail("compress_ratios", f"has {len(ratios)} entries; expected num_hidden_layers"
                    f" ({main}) or num_hidden_layers + num_nextn_predict_layers ({main + mtp})")
    for layer, ratio in enumerate(ratios):
        if not units.is_supported_ratio(ratio):
            reader.fail("compress_ratios", f"unsupported ratio {ratio} at layer {layer}"
                        " (supported: 0, 1, 4, powers of two >= 8)")
    ratios += [0] * (main + mtp - len(ratios))  # MTP layers are SWA (r = 0) unless listed
    window = reader.integer("sliding_window", minimum=2)
    head_dim = reader.integer("head_dim", minimum=1)
    rope = reader.integer("qk_rope_head_dim", minimum=0)
    if rope > head_dim:
        reader.fail("qk_rope_head_dim", f"{rope} exceeds head_dim {head_dim}")
    heads, dim, topk = 0, 0, 0  # the indexer exists only in CSA (r = 4) layers
    if units.OVERLAP_RATIO in ratios:
        heads, dim, topk = (reader.integer(key, minimum=1) for key in INDEX_KEYS)
    return Geometry(
        family=Family.DEEPSEEK_V4, num_key_value_heads=MLA_KV_HEADS, head_dim=head_dim,
        rope_head_dim=rope, kv_entry_shape=(head_dim,), window_tokens=window,
        layer_ratios=tuple(ratios), layer_windows=(window,) * len(ratios), index=(heads, dim, topk),
    )


def _mla_geometry(reader: ConfigReader, main: int, mtp: int, *, indexer: bool = False) -> Geometry:
    """Geometry of an MLA config: one ``kv_lora_rank + qk_rope_head_dim`` latent per token; with ``indexer``
    (DeepSeek-V3.2) every layer also keeps one lightning-indexer key of ``index_head_dim`` values per token.

    ``qk_nope_head_dim`` and ``v_head_dim`` size the decompressed heads, not the
    cache; they are read (and bounded) so a config missing them is refused.
    """
    rank = reader.integer("kv_lora_rank", minimum=1)
    rope = reader.integer("qk_rope_head_dim", minimum=0)
    for key in ("qk_nope_head_dim", "v_head_dim"):
        reader.integer(key, minimum=1)
    latent = rank + rope
    layers = main + mtp
    heads, dim, topk = (reader.integer(key, minimum=1) for key in INDEX_KEYS) if indexer else (0, 0, 0)
    if indexer and reader.present("layer_types"):  # written by transformers' DeepseekV32Config.to_dict()
        types = reader.string_list("layer_types")
        if len(types) != main or set(types) != {INDEXED}:
            reader.fail("layer_types", f"a deepseek_v32 config's layer types are {main} x {INDEXED!r} "
                        f"(num_hidden_layers), got {len(types)}: {sorted(set(types))}")
    return Geometry(
        family=Family.MLA, num_key_value_heads=MLA_KV_HEADS, head_dim=latent, rope_head_dim=rope,
        kv_entry_shape=(latent,), window_tokens=units.NO_WINDOW_TOKENS,
        layer_ratios=(FULL_LAYER[0],) * layers, layer_windows=(FULL_LAYER[1],) * layers,
        index=(heads, dim, topk), indexed_ratio=FULL_LAYER[0],
    )


def _standard_geometry(reader: ConfigReader, sliding: Sliding, layers: tuple[int, int], heads: int,
                       hidden_size: int) -> Geometry:
    """Geometry of an MHA / GQA / MQA config (MTP layers are FULL)."""
    main, mtp = layers
    head_dim = _head_dim(reader, heads, hidden_size)
    kv_heads = reader.integer("num_key_value_heads", minimum=1, default=heads)
    per_layer = LAYER_READERS[sliding](reader, main) + [FULL_LAYER] * mtp
    return Geometry(
        family=Family.STANDARD, num_key_value_heads=kv_heads, head_dim=head_dim, rope_head_dim=0,
        kv_entry_shape=(2, kv_heads, head_dim), window_tokens=max(w for _, w in per_layer),
        layer_ratios=tuple(r for r, _ in per_layer), layer_windows=tuple(w for _, w in per_layer),
    )


def _head_dim(reader: ConfigReader, heads: int, hidden_size: int) -> int:
    """``head_dim``, or ``hidden_size / num_attention_heads`` when the config has none."""
    if reader.present("head_dim"):
        return reader.integer("head_dim", minimum=1)
    if hidden_size % heads:
        reader.fail("head_dim", f"missing, and hidden_size {hidden_size} is not divisible by"
                    f" num_attention_heads {heads}")
    if hidden_size // heads > HEAD_DIM_MAX:
        reader.fail("head_dim", f"hidden_size / num_attention_heads = {hidden_size // heads}"
                    f" exceeds {HEAD_DIM_MAX} (hkv's limit)")
    return hidden_size // heads


LayerReader = Callable[[ConfigReader, int], list[tuple[int, int]]]


def _full_layers(reader: ConfigReader, main: int) -> list[tuple[int, int]]:
    """Every layer full attention (``Sliding.NONE``)."""
    return [FULL_LAYER] * main


def _uniform_layers(reader: ConfigReader, main: int) -> list[tuple[int, int]]:
    """Every layer sliding when ``sliding_window`` is set, else every layer full (``EVERY_LAYER``)."""
    if not reader.present("sliding_window"):
        return [FULL_LAYER] * main
    return [(0, reader.integer("sliding_window", minimum=2))] * main


def _typed_layers(reader: ConfigReader, main: int, *, enabled: bool = True) -> list[tuple[int, int]]:
    """Layers named by ``layer_types`` (``LAYER_TYPES``); sliding ones need ``enabled``."""
    types = reader.string_list("layer_types")
    if len(types) != main:
        reader.fail("layer_types", f"has {len(types)} entries, num_hidden_layers is {main}")
    for layer, kind in enumerate(types):
        if kind not in (SLIDING, FULL):
            reader.fail("layer_types", f"unknown layer type {kind!r} at layer {layer};"
                        f" known: {[SLIDING, FULL]}")
    if SLIDING not in types:
        return [FULL_LAYER] * main
    if not enabled:
        reader.fail("layer_types", "lists sliding_attention layers but use_sliding_window is not true")
    window = reader.integer("sliding_window", minimum=2)
    return [(0, window) if kind == SLIDING else FULL_LAYER for kind in types]


def _qwen_layers(reader: ConfigReader, main: int) -> list[tuple[int, int]]:
    """HF Qwen2 / Qwen3: ``layer_types`` when given, else layers >= ``max_window_layers`` slide,
    either only with ``use_sliding_window`` (``QWEN``)."""
    enabled = reader.boolean("use_sliding_window", default=False)
    if reader.present("layer_types"):
        return _typed_layers(reader, main, enabled=enabled)
    if not enabled:
        return [FULL_LAYER] * main
    first = reader.integer("max_window_layers")
    window = reader.integer("sliding_window", minimum=2)
    return [FULL_LAYER if layer < first else (0, window) for layer in range(main)]


def _alternate_layers(reader: ConfigReader, main: int) -> list[tuple[int, int]]:
    """HF Gemma 2: ``layer_types`` when given, else even layers slide and odd ones are full (``ALTERNATE``)."""
    return _periodic_layers(reader, main, period=lambda: 2)


def _pattern_layers(reader: ConfigReader, main: int) -> list[tuple[int, int]]:
    """HF Gemma 3: ``layer_types`` when given, else layer i is full when (i + 1) is a multiple of
    ``sliding_window_pattern`` and slides otherwise (``PATTERN``)."""
    return _periodic_layers(reader, main, period=lambda: reader.integer("sliding_window_pattern", minimum=1))


def _periodic_layers(reader: ConfigReader, main: int, *, period: Callable[[], int]) -> list[tuple[int, int]]:
    """``layer_types`` when given, else every ``period()``-th layer full and the rest sliding (the period is
    read only then, as transformers reads it)."""
    if reader.boolean("use_bidirectional_attention", default=False):
        reader.fail("use_bidirectional_attention", "a bidirectional (embedding) model keeps no causal KV cache "
                    "to resume from")
    if reader.present("layer_types"):
        return _typed_layers(reader, main)
    every, window = period(), reader.integer("sliding_window", minimum=2)
    return [FULL_LAYER if (layer + 1) % every == 0 else (0, window) for layer in range(main)]


# How each sliding rule reads the (compress ratio, window tokens) of the main layers.
LAYER_READERS: dict[Sliding, LayerReader] = {
    Sliding.NONE: _full_layers,
    Sliding.EVERY_LAYER: _uniform_layers,
    Sliding.LAYER_TYPES: _typed_layers,
    Sliding.QWEN: _qwen_layers,
    Sliding.ALTERNATE: _alternate_layers,
    Sliding.PATTERN: _pattern_layers,
}
assert set(LAYER_READERS) == set(Sliding)
