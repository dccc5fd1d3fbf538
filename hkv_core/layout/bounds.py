"""Upper limits of every size a model config gives, in one place (listed in ``docs/models.md``).

A config beyond a limit is refused with ``ConfigError`` naming the key while
it is read, before any group or pool is built: a layout costs time and memory
in proportion to its layers, so a typo such as ``num_hidden_layers: 1000000000``
must fail at once.  The limits are far above every published model (the
largest have about 128 layers, 128 heads, head_dim 576, hidden 16384, vocab
260,000) and low enough that the largest allowed layout builds in well under
a second and its sizes stay plain Python ints a NumPy index can hold.
"""

from __future__ import annotations

from hkv_core import units

LAYERS_MAX = 4096  # num_hidden_layers, max_window_layers: 32x the deepest published model
MTP_LAYERS_MAX = 64  # num_nextn_predict_layers: published models have 0 to 3 draft layers
HEADS_MAX = 4096  # num_attention_heads, num_key_value_heads, index_n_heads: 32x the most (128)
HEAD_DIM_MAX = 65_536  # head_dim, qk_*_head_dim, v_head_dim, index_head_dim, kv_lora_rank: values per head
HIDDEN_SIZE_MAX = 1 << 20  # hidden_size: 64x the widest published model (16384)
WINDOW_TOKENS_MAX = 1 << 24  # sliding_window: 16 Mi tokens, 8x the default max_request_tokens (2 Mi tokens)
COMPRESS_RATIO_MAX = 1 << 16  # compress_ratios entries: a compressor tail keeps up to r + 3 rows per layer
INDEX_TOPK_MAX = 1 << 20  # index_topk: compressed entries a CSA query selects (1024 in V4-Pro)
VOCAB_SIZE_MAX = 1 << 31  # vocab_size: token ids are int32 ([0, 2**31), see InvalidTokens)
BLOCK_TOKENS_MAX = 1 << 16  # hkv.block_tokens: engines use 16 to 256 tokens per block
ALIGNMENT_BYTES_MAX = 1 << 21  # hkv.alignment_bytes: a 2 MiB huge page, the largest page any tier aligns to
LAYER_LIST_ITEMS_MAX = LAYERS_MAX + MTP_LAYERS_MAX  # entries of a per-layer list (compress_ratios, layer_types)
CONV_KERNEL_MAX = 1024  # a linear layer's short convolution (published: 4): its state keeps kernel - 1 inputs
STATE_DIM_MAX = 65_536  # mamba_d_state: the SSM state per channel or head (published: 16 to 256)
EXPAND_MAX = 64  # mamba_expand: the intermediate size per hidden unit (published: 2)
RECURRENT_STATE_BYTES_MAX = 1 << 30  # one layer's recurrent state (Qwen3-Next: about 2 MiB): 1 GiB
CONFIG_FILE_BYTES_MAX = 16 << 20  # a config file read from disk (config.json, .toml): 16 MiB, checked before reading

# The limit of each integer key a config may give (nested ``hkv.`` keys by their bare name).
KEY_MAXIMUM: dict[str, int] = {
    "num_hidden_layers": LAYERS_MAX,
    "max_window_layers": LAYERS_MAX,
    "sliding_window_pattern": LAYERS_MAX,  # Gemma 3: every N-th layer is full
    "num_nextn_predict_layers": MTP_LAYERS_MAX,
    "num_attention_heads": HEADS_MAX,
    "num_key_value_heads": HEADS_MAX,
    "index_n_heads": HEADS_MAX,
    "head_dim": HEAD_DIM_MAX,
    "qk_rope_head_dim": HEAD_DIM_MAX,
    "qk_nope_head_dim": HEAD_DIM_MAX,
    "v_head_dim": HEAD_DIM_MAX,
    "index_head_dim": HEAD_DIM_MAX,
    "kv_lora_rank": HEAD_DIM_MAX,
    "hidden_size": HIDDEN_SIZE_MAX,
    "sliding_window": WINDOW_TOKENS_MAX,
    "compress_ratios": COMPRESS_RATIO_MAX,
    "index_topk": INDEX_TOPK_MAX,
    "vocab_size": VOCAB_SIZE_MAX,
    "block_tokens": BLOCK_TOKENS_MAX,
    "alignment_bytes": ALIGNMENT_BYTES_MAX,
    # linear-attention / state-space hybrids (hkv_core/layout/recurrent.py)
    "full_attention_interval": LAYERS_MAX,
    "attn_layer_period": LAYERS_MAX,
    "attn_layer_offset": LAYERS_MAX - 1,  # below attn_layer_period
    "kda_layers": LAYERS_MAX,
    "full_attn_layers": LAYERS_MAX,
    "linear_num_key_heads": HEADS_MAX,
    "linear_num_value_heads": HEADS_MAX,
    "num_heads": HEADS_MAX,
    "mamba_n_heads": HEADS_MAX,
    "mamba_n_groups": HEADS_MAX,
    "linear_key_head_dim": HEAD_DIM_MAX,
    "linear_value_head_dim": HEAD_DIM_MAX,
    "mamba_d_head": HEAD_DIM_MAX,
    "linear_conv_kernel_dim": CONV_KERNEL_MAX,
    "short_conv_kernel_size": CONV_KERNEL_MAX,
    "mamba_d_conv": CONV_KERNEL_MAX,
    "mamba_d_state": STATE_DIM_MAX,
    "mamba_expand": EXPAND_MAX,
}

assert units.is_supported_ratio(COMPRESS_RATIO_MAX)  # the largest ratio allowed is a usable one
assert ALIGNMENT_BYTES_MAX & (ALIGNMENT_BYTES_MAX - 1) == 0  # alignments are powers of two
assert LAYERS_MAX * HEADS_MAX * HEAD_DIM_MAX < 1 << 63  # every size product fits an int64
assert all(limit >= 1 for limit in KEY_MAXIMUM.values())


def key_maximum(key: str) -> int:
    """The limit of integer config key ``key`` (every key read as an int has one)."""
    assert key in KEY_MAXIMUM, f"config key {key!r} has no upper limit in layout/bounds.py"
    return KEY_MAXIMUM[key]
