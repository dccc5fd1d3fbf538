"""Linear-attention and state-space hybrids: which layers keep a recurrent state, and its shape.

A hybrid's attention layers cache K and V (or an MLA latent) like any other
model; each of its other layers keeps one fixed-size recurrent state instead:
a short convolution's last ``kernel - 1`` inputs and a recurrent matrix (Mamba's
SSM state, Gated DeltaNet's or KDA's delta-rule state).  A resume at P needs
that state exactly as it was after token P - 1 (``docs/models.md``, "Linear
and state-space hybrids").  Each supported type has one ``RecurrentRule``:
the keys its recurrent layers are read from (foreign to every other type),
how it says which layers are recurrent, and the shape of their state, as
transformers' config class and vLLM's state-shape calculator read them.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from hkv_core.layout.bounds import RECURRENT_STATE_BYTES_MAX
from hkv_core.layout.kinds import DTYPE_BYTES, HF_DTYPES, SSM_STATE_DTYPE
from hkv_core.layout.reader import ConfigReader
from hkv_core.layout.records import RecurrentShape

HKV_TABLE = "hkv"
SSM_DTYPE_KEY = "ssm_state_dtype"  # hkv option: the dtype the recurrent state is kept in (default fp32)
LINEAR, FULL = "linear_attention", "full_attention"  # Qwen3-Next's layer_types
MAMBA, ATTENTION = "mamba", "attention"  # Granite 4.0-H's layer_types

Shapes = tuple[tuple[int, ...], tuple[int, ...]]  # (conv state shape, ssm state shape) of one layer


@attrs.frozen
class RecurrentRule:
    """How one hybrid type's config names its recurrent layers and their state."""

    mixer: str
    keys: tuple[str, ...]  # config keys of its recurrent layers (a config of another type must not carry them)
    layers: Callable[[ConfigReader, int], frozenset[int]]  # (reader, main layers) -> the recurrent layer ids
    shapes: Callable[[ConfigReader, int], Shapes]  # (reader, hidden_size) -> one layer's state shapes
    reads_layer_types: bool = False  # its layers are named by layer_types (else a layer_types key is refused)
    layers_key: str = "layer_types"  # the key naming its layers when layer_types is not given


def read_recurrent(reader: ConfigReader, rule: RecurrentRule, main: int, hidden_size: int,
                   kv_dtype: str) -> tuple[frozenset[int], RecurrentShape]:
    """The recurrent layers of a hybrid config and the state each keeps (ConfigError naming the key)."""
    layers = rule.layers(reader, main)
    key = "layer_types" if rule.reads_layer_types and reader.present("layer_types") else rule.layers_key
    if not layers:
        reader.fail(key, f"names no {rule.mixer} layer; a hybrid config without one is not this type")
    if len(layers) == main:
        reader.fail(key, f"names every layer {rule.mixer}: hkv needs at least one attention layer to index a "
                    "prefix by")
    conv, ssm = rule.shapes(reader, hidden_size)
    state = RecurrentShape(mixer=rule.mixer, conv_shape=conv, conv_dtype=kv_dtype, ssm_shape=ssm,
                           ssm_dtype=_ssm_dtype(reader))
    if state.bytes_per_layer > RECURRENT_STATE_BYTES_MAX:
        reader.fail(rule.keys[0], f"one {rule.mixer} layer's state would take {state.bytes_per_layer} bytes "
                    f"(conv {conv}, ssm {ssm}); at most {RECURRENT_STATE_BYTES_MAX} (hkv's limit)")
    return layers, state


def _ssm_dtype(reader: ConfigReader) -> str:
    table = reader.table(HKV_TABLE)
    name = table.string(SSM_DTYPE_KEY, default=SSM_STATE_DTYPE)
    dtype = HF_DTYPES.get(name, name)
    if dtype not in DTYPE_BYTES:
        table.fail(SSM_DTYPE_KEY, f"unsupported dtype {name!r}; known: {sorted(DTYPE_BYTES)}")
    return dtype


def _kernel_rows(reader: ConfigReader, key: str, default: int) -> int:
    """A convolution's state rows: its last kernel - 1 inputs (kernel at least 2)."""
    return reader.integer(key, minimum=2, default=default) - 1


def _typed(reader: ConfigReader, main: int, key: str, recurrent: tuple[str, ...],
           attention: tuple[str, ...]) -> frozenset[int]:
    """Layers named one of `recurrent` in the per-layer list `key` (every entry one of `recurrent` or
    `attention`: a checkpoint's names, and those transformers writes for them)."""
    types = reader.string_list(key)
    if len(types) != main:
        reader.fail(key, f"has {len(types)} entries, num_hidden_layers is {main}")
    for layer, kind in enumerate(types):
        if kind not in recurrent + attention:
            reader.fail(key, f"unknown layer type {kind!r} at layer {layer}; known: {[*recurrent, *attention]}")
    return frozenset(i for i, kind in enumerate(types) if kind in recurrent)


# ---------------------------------------------------------------- Qwen3-Next: Gated DeltaNet


def _qwen3_next_layers(reader: ConfigReader, main: int) -> frozenset[int]:
    """``layer_types`` when given, else every ``full_attention_interval``-th layer is full attention
    (transformers' Qwen3NextConfig: layer i is linear when (i + 1) % interval != 0)."""
    if reader.present("layer_types"):
        return _typed(reader, main, "layer_types", (LINEAR,), (FULL,))
    every = reader.integer("full_attention_interval", minimum=1, default=4)
    return frozenset(i for i in range(main) if (i + 1) % every)


def _gated_deltanet_shapes(reader: ConfigReader, hidden_size: int) -> Shapes:
    """conv: (2 * key_dim + value_dim, kernel - 1) - q, k and v convolved together; ssm: (value heads,
    key head dim, value head dim)."""
    k_heads = reader.integer("linear_num_key_heads", minimum=1)
    v_heads = reader.integer("linear_num_value_heads", minimum=1)
    k_dim = reader.integer("linear_key_head_dim", minimum=1)
    v_dim = reader.integer("linear_value_head_dim", minimum=1)
    if v_heads % k_heads:
        reader.fail("linear_num_value_heads", f"{v_heads} value heads cannot share {k_heads} key heads "
                    "(must be a multiple of linear_num_key_heads)")
    rows = _kernel_rows(reader, "linear_conv_kernel_dim", 4)
    return (2 * k_heads * k_dim + v_heads * v_dim, rows), (v_heads, k_dim, v_dim)


# ---------------------------------------------------------------- Kimi Linear: Kimi Delta Attention


def _kimi_layers(reader: ConfigReader, main: int) -> frozenset[int]:
    """``linear_attn_config.kda_layers`` (1-based layer numbers); ``full_attn_layers`` the others, and the two
    must split the layers exactly."""
    table = reader.table("linear_attn_config")
    kda = table.int_list("kda_layers", minimum=1)
    full = table.int_list("full_attn_layers", minimum=1)
    if sorted(kda + full) != list(range(1, main + 1)):
        table.fail("kda_layers", f"kda_layers and full_attn_layers must split layers 1..{main} (1-based) "
                   f"between them, got {len(kda)} + {len(full)} entries")
    return frozenset(n - 1 for n in kda)


def _kda_shapes(reader: ConfigReader, hidden_size: int) -> Shapes:
    """conv: (3 * heads * head_dim, kernel - 1) - q, k and v each through a short convolution of their own,
    kept side by side; ssm: (heads, head_dim, head_dim)."""
    table = reader.table("linear_attn_config")
    heads = table.integer("num_heads", minimum=1)
    dim = table.integer("head_dim", minimum=1)
    rows = _kernel_rows(table, "short_conv_kernel_size", 4)
    return (3 * heads * dim, rows), (heads, dim, dim)


# ---------------------------------------------------------------- Jamba: Mamba (1)


def _jamba_layers(reader: ConfigReader, main: int) -> frozenset[int]:
    """Layer i is attention when i % attn_layer_period == attn_layer_offset, else Mamba (JambaConfig)."""
    period = reader.integer("attn_layer_period", minimum=1, default=8)
    offset = reader.integer("attn_layer_offset", default=4)
    if offset >= period:
        reader.fail("attn_layer_offset", f"{offset} is not below attn_layer_period {period}")
    return frozenset(i for i in range(main) if i % period != offset)


def _mamba_shapes(reader: ConfigReader, hidden_size: int) -> Shapes:
    """conv: (intermediate, d_conv - 1); ssm: (intermediate, d_state), intermediate = expand * hidden_size."""
    inner = reader.integer("mamba_expand", minimum=1, default=2) * hidden_size
    return (inner, _kernel_rows(reader, "mamba_d_conv", 4)), (inner, reader.integer("mamba_d_state", minimum=1,
                                                                                       default=16))


# ---------------------------------------------------------------- Granite 4.0-H: Mamba-2


def _granite_layers(reader: ConfigReader, main: int) -> frozenset[int]:
    """``layer_types``: ``mamba`` / ``attention`` as checkpoints write them, or ``linear_attention`` /
    ``full_attention`` as transformers (which renames them on load) writes them back."""
    return _typed(reader, main, "layer_types", (MAMBA, LINEAR), (ATTENTION, FULL))


def _mamba2_shapes(reader: ConfigReader, hidden_size: int) -> Shapes:
    """conv: (intermediate + 2 * n_groups * d_state, d_conv - 1) - x, B and C convolved together; ssm: (heads,
    head_dim, d_state); intermediate = expand * hidden_size = heads * head_dim."""
    inner = reader.integer("mamba_expand", minimum=1, default=2) * hidden_size
    heads = reader.integer("mamba_n_heads", minimum=1, default=128)
    groups = reader.integer("mamba_n_groups", minimum=1, default=1)
    d_state = reader.integer("mamba_d_state", minimum=1, default=256)
    head_dim = inner // heads
    if reader.config.get("mamba_d_head", "auto") != "auto":
        head_dim = reader.integer("mamba_d_head", minimum=1)
    if heads % groups:
        reader.fail("mamba_n_groups", f"{groups} groups cannot share {heads} heads (must divide mamba_n_heads)")
    if head_dim * heads != inner:
        reader.fail("mamba_n_heads", f"{heads} heads of {head_dim} must make the intermediate size {inner} "
                    "(mamba_expand x hidden_size)")
    conv = (inner + 2 * groups * d_state, _kernel_rows(reader, "mamba_d_conv", 4))
    return conv, (heads, head_dim, d_state)


_QWEN3_NEXT_KEYS = ("linear_num_value_heads", "linear_num_key_heads", "linear_key_head_dim",
                    "linear_value_head_dim", "linear_conv_kernel_dim", "full_attention_interval")
_JAMBA_KEYS = ("mamba_d_state", "mamba_d_conv", "mamba_expand", "attn_layer_period", "attn_layer_offset")
_GRANITE_KEYS = ("mamba_n_heads", "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_n_groups",
                 "mamba_d_head")

RECURRENT_RULES: dict[str, RecurrentRule] = {
    "qwen3_next": RecurrentRule("gated_deltanet", _QWEN3_NEXT_KEYS, _qwen3_next_layers, _gated_deltanet_shapes,
                                reads_layer_types=True, layers_key="full_attention_interval"),
    "kimi_linear": RecurrentRule("kda", ("linear_attn_config",), _kimi_layers, _kda_shapes,
                                 layers_key="linear_attn_config"),
    "jamba": RecurrentRule("mamba", _JAMBA_KEYS, _jamba_layers, _mamba_shapes, layers_key="attn_layer_period"),
    "granitemoehybrid": RecurrentRule("mamba2", _GRANITE_KEYS, _granite_layers, _mamba2_shapes,
                                      reads_layer_types=True),
}
# Keys of the recurrent layers of some hybrid type; a config of any other type carrying one is refused.
RECURRENT_KEYS: frozenset[str] = frozenset(key for rule in RECURRENT_RULES.values() for key in rule.keys) | {
    "hybrid_override_pattern", "ssm_state_size", "mamba_num_heads", "mamba_head_dim", "mamba_d_ssm",
    "mamba_n_heads", "linear_attn_config"}


def foreign_recurrent_keys(model_type: str) -> dict[str, str]:
    """The recurrent keys a config of `model_type` must not carry (another hybrid's), with why."""
    rule = RECURRENT_RULES.get(model_type)
    own = set(rule.keys) if rule else set()
    why = "another hybrid type's recurrent-layer key" if rule else \
        "a linear-attention / state-space layer's key; this type has no such layers"
    out = {key: why for key in sorted(RECURRENT_KEYS - own)}
    if rule and not rule.reads_layer_types:
        out["layer_types"] = f"{model_type} names its {rule.mixer} layers by {rule.layers_key}, not layer_types"
    return out
