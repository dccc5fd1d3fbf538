"""Closed vocabularies of the layout: attention kinds, object kinds, entry kinds, dtypes.

Behaviour is selected by looking these up in tables, never by ``if`` chains on
strings.  Values are the strings that appear in reports and abi ids.
"""

from __future__ import annotations

from enum import StrEnum

from hkv_core import units


class AttentionKind(StrEnum):
    """What a layer attends to (``docs/v4_cache.md`` section 1)."""

    SWA = "SWA"  # r = 0: the sliding window of raw tokens only
    CSA = "CSA"  # r = 4: window + top-k compressed entries chosen by the indexer
    HCA = "HCA"  # r >= 8: window + every visible compressed entry
    FULL = "FULL"  # r = 1: classic full attention; raw KV = identity-compressed entries
    LINEAR = "LINEAR"  # no KV: a linear-attention / state-space layer keeps one fixed-size recurrent state


class ObjectKind(StrEnum):
    """The device-resident object kinds of ``specs/lifecycle.toml``."""

    COMPRESSED_KV = "compressed_kv"
    COMPRESSOR_TAIL = "compressor_tail"
    SWA_WINDOW = "swa_window"
    INDEXER_STATE = "indexer_state"
    RECURRENT_STATE = "recurrent_state"


class EntryKind(StrEnum):
    """What one entry of a pool is, which fixes how many tokens it covers."""

    COMPRESSED_ENTRY = "compressed_entry"  # one per r tokens (K_j or KI_j)
    TAIL_ROW = "tail_row"  # one (a, z) compressor row per token
    WINDOW_ROW = "window_row"  # one raw kv row per token
    CONV_STATE = "conv_state"  # a linear layer's short-convolution state: one entry, the whole state at P
    SSM_STATE = "ssm_state"  # a linear layer's recurrent (SSM / delta-rule) state: one entry, the whole state at P
    RING_ROW = "ring_row"  # a request's ring of its last compressor rows (an engine's scratch: never shared)
    STATE_COLUMN = "state_column"  # an engine's recurrent state laid out per block (vLLM's Mamba groups, align mode):
    #     one page per block column; the engine writes the state after each step's last token into that token's
    #     column, so a column holds the state at its block's end exactly when a step ended there


# Pool component name per (object kind, entry kind): the suffix of pool names and
# the first field of abi ids.  The indexer state has two parts (keys and tail).
COMPONENTS: dict[tuple[ObjectKind, EntryKind], str] = {
    (ObjectKind.COMPRESSED_KV, EntryKind.COMPRESSED_ENTRY): "compressed_kv",
    (ObjectKind.COMPRESSOR_TAIL, EntryKind.TAIL_ROW): "compressor_tail",
    (ObjectKind.SWA_WINDOW, EntryKind.WINDOW_ROW): "swa_window",
    (ObjectKind.INDEXER_STATE, EntryKind.COMPRESSED_ENTRY): "indexer_state.keys",
    (ObjectKind.INDEXER_STATE, EntryKind.TAIL_ROW): "indexer_state.tail",
    (ObjectKind.RECURRENT_STATE, EntryKind.CONV_STATE): "recurrent_state.conv",
    (ObjectKind.RECURRENT_STATE, EntryKind.SSM_STATE): "recurrent_state.ssm",
    (ObjectKind.COMPRESSOR_TAIL, EntryKind.RING_ROW): "compressor_tail.ring",
    (ObjectKind.RECURRENT_STATE, EntryKind.STATE_COLUMN): "recurrent_state.column",
}
# Entry kinds of point snapshots: one page per retained resume point holds what a resume at exactly P reads.
SNAPSHOT_ENTRIES = frozenset({EntryKind.TAIL_ROW, EntryKind.CONV_STATE, EntryKind.SSM_STATE})
STATE_ENTRIES = frozenset({EntryKind.CONV_STATE, EntryKind.SSM_STATE})  # one entry: the state after token P - 1

# Canonical order of groups in a layout.
KIND_ORDER: tuple[AttentionKind, ...] = (
    AttentionKind.SWA,
    AttentionKind.CSA,
    AttentionKind.HCA,
    AttentionKind.FULL,
    AttentionKind.LINEAR,
)

# Element sizes of the dtypes pools may use, by short name.
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}  # fp8: an engine's 8-bit cache (bytes)
# Hugging Face ``torch_dtype`` / ``dtype`` names -> short names.
HF_DTYPES: dict[str, str] = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
DEFAULT_KV_DTYPE = "bf16"
TAIL_DTYPE = "fp32"  # compressor (a, z) rows: kept in full precision
TAIL_ROW_PARTS = 2  # a tail row stores a and z, each c*d wide
SSM_STATE_DTYPE = "fp32"  # a recurrent state accumulates over every token: kept in full precision by default

assert set(HF_DTYPES.values()) <= set(DTYPE_BYTES)
assert DEFAULT_KV_DTYPE in DTYPE_BYTES and TAIL_DTYPE in DTYPE_BYTES and SSM_STATE_DTYPE in DTYPE_BYTES


def attention_kind(ratio: int) -> AttentionKind:
    """The attention kind of a layer with compress ratio ``ratio`` (must be supported)."""
    r = units.checked_ratio(ratio)
    fixed = {0: AttentionKind.SWA, 1: AttentionKind.FULL, units.OVERLAP_RATIO: AttentionKind.CSA}
    return fixed.get(r, AttentionKind.HCA)
