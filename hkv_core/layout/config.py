"""Validate a Hugging Face style config dict into a ``ModelConfig``.

The family is read from ``model_type`` through the one table of supported
types (``model_types.MODEL_TYPES``); a missing or unknown type is refused, and
so is a key that contradicts the type (``model_types.foreign_keys``).  Every
integer is bounded (``bounds.py``) as it is read, and the head counts are
checked against each other, before any group or pool is built.  The
family-specific part is read by ``geometry.read_geometry``.  Errors raise
``ConfigError(source=..., key=...)``; nothing is built on error.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from hkv_core import units
from hkv_core.errors import ConfigError
from hkv_core.layout.bounds import ALIGNMENT_BYTES_MAX, BLOCK_TOKENS_MAX
from hkv_core.layout.geometry import Geometry, read_geometry
from hkv_core.layout.kinds import DEFAULT_KV_DTYPE, DTYPE_BYTES, HF_DTYPES
from hkv_core.layout.model_types import (
    MODEL_TYPES,
    RECURRENT_MODEL_TYPES,
    ModelType,
    foreign_keys,
    supported_model_types,
)
from hkv_core.layout.reader import ConfigReader
from hkv_core.layout.recurrent import RECURRENT_RULES, SSM_DTYPE_KEY, read_recurrent

DEFAULT_BLOCK_TOKENS = 256  # vLLM's recommended V4 block; TensorRT-LLM allows 128 or 256
DEFAULT_ALIGNMENT_BYTES = 4096  # direct I/O alignment: every page can be DMA'd and O_DIRECT'd
HKV_TABLE = "hkv"  # optional table of hkv-only options inside a config / preset
HKV_KEYS = ("block_tokens", "alignment_bytes", SSM_DTYPE_KEY)
MODEL_TYPE_KEY = "model_type"

assert DEFAULT_BLOCK_TOKENS <= BLOCK_TOKENS_MAX and DEFAULT_ALIGNMENT_BYTES <= ALIGNMENT_BYTES_MAX


@attrs.frozen(kw_only=True)
class ModelConfig:
    """A fully validated model config."""

    name: str
    source: str
    model_type: str
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
    type_name, model_type = _model_type(reader)
    if model_type.text_config:
        reader = _text_config(reader, type_name, model_type)
    if model_type.defaults:  # what transformers' config class fills in where the file is silent (a null stays)
        reader = ConfigReader({**dict(model_type.defaults), **reader.config}, source=reader.source)
    main = reader.integer("num_hidden_layers", minimum=1)
    mtp = reader.integer("num_nextn_predict_layers", default=0)
    heads = _attention_heads(reader)
    hidden = reader.integer("hidden_size", minimum=1)
    vocab = reader.integer("vocab_size", default=0)
    block, alignment = _hkv_options(reader, block_tokens)
    geometry = read_geometry(reader, model_type, (main, mtp), heads, hidden)
    kv_dtype = _kv_dtype(reader)
    if model_type.recurrent:
        linear, state = read_recurrent(reader, RECURRENT_RULES[type_name], main, hidden, kv_dtype)
        geometry = attrs.evolve(geometry, linear_layers=linear, state=state)
    elif reader.table(HKV_TABLE).present(SSM_DTYPE_KEY):
        reader.table(HKV_TABLE).fail(SSM_DTYPE_KEY, f"a {type_name!r} model keeps no recurrent state")
    return ModelConfig(
        name=name, source=source, model_type=type_name, main_layers=main, mtp_layers=mtp,
        hidden_size=hidden, num_attention_heads=heads, vocab_size=vocab, kv_dtype=kv_dtype,
        block_tokens=block, alignment_bytes=alignment, geometry=geometry,
    )


def _model_type(reader: ConfigReader) -> tuple[str, ModelType]:
    """The config's ``model_type`` and its table entry; refuses keys that contradict it."""
    supported = f"supported: {supported_model_types()}"
    if not reader.present(MODEL_TYPE_KEY):
        reader.fail(MODEL_TYPE_KEY, f"missing; hkv reads a config by its model type ({supported})")
    name = reader.string(MODEL_TYPE_KEY)
    if name in RECURRENT_MODEL_TYPES:
        reader.fail(MODEL_TYPE_KEY, f"model type {name!r} is a hybrid with {RECURRENT_MODEL_TYPES[name]}, whose "
                    "recurrent state hkv does not manage yet (docs/models.md); its attention layers alone would "
                    f"not resume exactly ({supported})")
    if name not in MODEL_TYPES:
        reader.fail(MODEL_TYPE_KEY, f"unsupported model type {name!r} ({supported})")
    model_type = MODEL_TYPES[name]
    for key, why in foreign_keys(model_type, name).items():
        if reader.present(key):
            reader.fail(key, f"a {name!r} config must not have {key!r}: {why}")
    return name, model_type


def _text_config(reader: ConfigReader, type_name: str, model_type: ModelType) -> ConfigReader:
    """A multimodal config's ``text_config`` (of type ``model_type.text_config``), read as a ``type_name``
    config; the outer dtype and ``hkv`` table apply where it has none."""
    if not reader.present("text_config"):
        reader.fail("text_config", f"missing; a {type_name!r} config keeps its text model there")
    inner = reader.table("text_config").config
    found = inner.get(MODEL_TYPE_KEY, model_type.text_config)
    if found != model_type.text_config:
        reader.fail("text_config", f"its model_type is {found!r}, not {model_type.text_config!r}")
    dtype_keys = ("torch_dtype", "dtype") if not any(key in inner for key in ("torch_dtype", "dtype")) else ()
    outer = {key: reader.config[key] for key in (*dtype_keys, HKV_TABLE) if key in reader.config}
    text = ConfigReader({**outer, **inner, MODEL_TYPE_KEY: type_name}, source=f"{reader.source} (text_config)")
    _model_type(text)  # the text config's own keys must not contradict the type either
    return text


def _attention_heads(reader: ConfigReader) -> int:
    """``num_attention_heads``, checked against ``num_key_value_heads`` when that is given."""
    heads = reader.integer("num_attention_heads", minimum=1)
    kv_heads = reader.integer("num_key_value_heads", minimum=1, default=heads)
    if kv_heads > heads or heads % kv_heads:
        reader.fail("num_key_value_heads", f"{kv_heads} KV heads cannot serve {heads} attention heads"
                    " (must divide num_attention_heads)")
    return heads


def _kv_dtype(reader: ConfigReader) -> str:
    """The dtype of stored K/V (``torch_dtype`` or ``dtype``; default bf16)."""
    key = "dtype" if reader.present("dtype") else "torch_dtype"
    name = reader.string(key, default=DEFAULT_KV_DTYPE)
    dtype = HF_DTYPES.get(name, name)
    if dtype not in HF_DTYPES.values():  # (fp8 is an engine's cache format, never a config's dtype)
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
