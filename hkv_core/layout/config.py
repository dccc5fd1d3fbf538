"""Validate a Hugging Face style config dict into a ``ModelConfig``.

Three families are recognised, by which keys are present:

- DeepSeek-V4 (``compress_ratios``): every layer keeps a sliding window of
  ``sliding_window`` tokens; its ratio picks SWA / CSA / HCA (/ FULL for r=1).
  K and V are one shared latent of ``head_dim`` values.
- sliding + full (``layer_types`` of ``sliding_attention`` / ``full_attention``,
  gpt-oss / Gemma style), or every layer sliding (``sliding_window`` alone).
- classic full attention (none of the above): every layer is FULL.

FULL layers store their raw K and V as ``compressed_kv`` entries with compress
ratio 1 (the identity compressor: one entry per token, no tail, no window).
Errors raise ``ConfigError(source=..., key=...)``; nothing is built on error.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from hkv_core import units
from hkv_core.errors import ConfigError
from hkv_core.layout.kinds import DEFAULT_KV_DTYPE, DTYPE_BYTES, HF_DTYPES
from hkv_core.layout.reader import ConfigReader

DEFAULT_BLOCK_TOKENS = 256  # vLLM's recommended V4 block; TensorRT-LLM allows 128 or 256
DEFAULT_ALIGNMENT_BYTES = 4096  # direct I/O alignment: every page can be DMA'd and O_DIRECT'd
HKV_TABLE = "hkv"  # optional table of hkv-only options inside a config / preset
HKV_KEYS = ("block_tokens", "alignment_bytes")
INDEX_KEYS = ("index_n_heads", "index_head_dim", "index_topk")
SLIDING, FULL = "sliding_attention", "full_attention"  # known HF ``layer_types``
FULL_LAYER = (1, units.NO_WINDOW_TOKENS)  # (compress ratio, window tokens) of a FULL layer


@attrs.frozen(kw_only=True)
class Geometry:
    """The family-specific part of a config; per-layer tuples list main layers, then MTP."""

    family: str
    num_key_value_heads: int
    head_dim: int
    rope_head_dim: int
    kv_entry_shape: tuple[int, ...]
    window_tokens: int
    layer_ratios: tuple[int, ...]
    layer_windows: tuple[int, ...]
    index: tuple[int, int, int] = (0, 0, 0)  # index_n_heads, index_head_dim, index_topk


@attrs.frozen(kw_only=True)
class ModelConfig:
    """A fully validated model config."""

    name: str
    source: str
    main_layers: int
    mtp_layers: int
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    kv_dtype: str
    block_tokens: int
    alignment_bytes: int
    geometry: Geometry

    def __attrs_post_init__(self) -> None:
        layers = self.main_layers + self.mtp_layers
        g = self.geometry
        assert len(g.layer_ratios) == len(g.layer_windows) == layers, self
        assert all(units.is_supported_ratio(r) for r in g.layer_ratios), g.layer_ratios
        assert self.kv_dtype in DTYPE_BYTES, self.kv_dtype


def parse_config(
    config: object, *, name: str, source: str, block_tokens: int | None = None
) -> ModelConfig:
    """Validate ``config`` (a HF ``config.json`` dict) and return a ``ModelConfig``."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"config must be a mapping, got {type(config).__name__}",
                          source=source, key="<root>")
    reader = ConfigReader(config, source=source)
    main = reader.integer("num_hidden_layers", minimum=1)
    mtp = reader.integer("num_nextn_predict_layers", default=0)
    heads = reader.integer("num_attention_heads", minimum=1)
    hidden = reader.integer("hidden_size", minimum=1)
    block, alignment = _hkv_options(reader, block_tokens)
    if "compress_ratios" in config:
        geometry = _v4_geometry(reader, main, mtp)
    else:
        geometry = _standard_geometry(reader, main, mtp, heads, hidden)
    return ModelConfig(
        name=name, source=source, main_layers=main, mtp_layers=mtp, hidden_size=hidden,
        num_attention_heads=heads, vocab_size=reader.integer("vocab_size", default=0),
        kv_dtype=_kv_dtype(reader), block_tokens=block, alignment_bytes=alignment,
        geometry=geometry,
    )


def _kv_dtype(reader: ConfigReader) -> str:
    """The dtype of stored K/V (``torch_dtype`` or ``dtype``; default bf16)."""
    key = "dtype" if reader.config.get("dtype") is not None else "torch_dtype"
    name = reader.string(key, default=DEFAULT_KV_DTYPE)
    dtype = HF_DTYPES.get(name, name)
    if dtype not in DTYPE_BYTES:
        reader.fail(key, f"unsupported dtype {name!r}; known: {sorted(HF_DTYPES)}")
    return dtype


def _hkv_options(reader: ConfigReader, block_tokens: int | None) -> tuple[int, int]:
    """``block_tokens`` and ``alignment_bytes`` from the optional ``hkv`` table / keyword."""
    table = reader.table(HKV_TABLE)
    for key in table.config:
        if key not in HKV_KEYS:
            table.fail(key, f"unknown hkv option; known: {list(HKV_KEYS)}")
    block = table.integer("block_tokens", minimum=1, default=DEFAULT_BLOCK_TOKENS)
    if block_tokens is not None:
        keyword = ConfigReader({"block_tokens": block_tokens}, source=reader.source)
        block = keyword.integer("block_tokens", minimum=1)
    alignment = table.integer("alignment_bytes", minimum=1, default=DEFAULT_ALIGNMENT_BYTES)
    if alignment & (alignment - 1):
        table.fail("alignment_bytes", f"must be a power of two, got {alignment}")
    return block, alignment


def _v4_geometry(reader: ConfigReader, main: int, mtp: int) -> Geometry:
    """Geometry of a DeepSeek-V4 style config (``compress_ratios`` present)."""
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
        family="deepseek_v4", num_key_value_heads=1, head_dim=head_dim, rope_head_dim=rope,
        kv_entry_shape=(head_dim,), window_tokens=window, layer_ratios=tuple(ratios),
        layer_windows=(window,) * len(ratios), index=(heads, dim, topk),
    )


def _standard_geometry(
    reader: ConfigReader, main: int, mtp: int, heads: int, hidden: int
) -> Geometry:
    """Geometry of a classic or sliding + full attention config (MTP layers are FULL)."""
    if reader.config.get("head_dim") is None and hidden % heads:
        reader.fail("head_dim", f"missing and hidden_size {hidden} is not divisible by {heads}")
    head_dim = reader.integer("head_dim", minimum=1, default=hidden // heads)
    kv_heads = reader.integer("num_key_value_heads", minimum=1, default=heads)
    layers = _standard_layers(reader, main) + [FULL_LAYER] * mtp
    return Geometry(
        family="standard", num_key_value_heads=kv_heads, head_dim=head_dim, rope_head_dim=0,
        kv_entry_shape=(2, kv_heads, head_dim), window_tokens=max(w for _, w in layers),
        layer_ratios=tuple(r for r, _ in layers), layer_windows=tuple(w for _, w in layers),
    )


def _standard_layers(reader: ConfigReader, main: int) -> list[tuple[int, int]]:
    """(compress ratio, window tokens) of each main layer of a standard config."""
    if reader.config.get("layer_types") is None:
        sliding = reader.config.get("sliding_window") is not None and reader.boolean(
            "use_sliding_window", default=True)
        window = reader.integer("sliding_window", minimum=2) if sliding else 0
        return [(0, window) if window else FULL_LAYER] * main
    types = reader.string_list("layer_types")
    if len(types) != main:
        reader.fail("layer_types", f"has {len(types)} entries, num_hidden_layers is {main}")
    for layer, kind in enumerate(types):
        if kind not in (SLIDING, FULL):
            reader.fail("layer_types", f"unknown layer type {kind!r} at layer {layer};"
                        f" known: {[SLIDING, FULL]}")
    window = reader.integer("sliding_window", minimum=2) if SLIDING in types else 0
    return [(0, window) if kind == SLIDING else FULL_LAYER for kind in types]
