"""Layouts an engine lays out itself: one layer per engine cache group, each group its own page geometry.

An engine such as vLLM decides its KV cache groups (full attention or a
sliding window each, with its own block size, dtype and KV shape) and shares
one pool of blocks between them.  `engine_layout` turns that list into an hkv
`Layout` of the standard family: engine group i is main layer i; groups of
one geometry share one hkv layer group (and so one pool), groups that differ
get their own.  A page is one engine block: `tokens_per_page` tokens.

hkv's block (`block_tokens`, the unit it keys and commits) must divide every
page.  A page of several blocks is served whole: a full-attention page like
any multi-block prefix page (hits land where every pool's page ends unless
the manager allows partial-page copies), a window page kept while any of its
rows is inside the window of a kept resume point or a running request (a
resume point lies on a boundary of every window page).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from hkv_core.errors import ConfigError
from hkv_core.layout.bounds import (
    ALIGNMENT_BYTES_MAX,
    BLOCK_TOKENS_MAX,
    HEAD_DIM_MAX,
    HEADS_MAX,
    LAYERS_MAX,
    WINDOW_TOKENS_MAX,
)
from hkv_core.layout.kinds import DTYPE_BYTES, AttentionKind, EntryKind, ObjectKind
from hkv_core.layout.model import Layout
from hkv_core.layout.records import LayerGroup, PoolSpec, RecurrentShape, make_pool

ENGINE_MODEL_TYPE = "engine"  # Layout.model_type of an engine-laid-out layout (part of every block key's root)
FULL_RATIO, WINDOW_RATIO = 1, 0  # compress ratios of a full-attention and of a sliding-window layer


@attrs.frozen(kw_only=True)
class EngineGroup:
    """One engine KV cache group: its sliding window in tokens (0: full attention), tokens per block (one hkv
    page), KV dtype (`fp16`, `bf16`, `fp32`, `fp8`), and KV heads and head size (K and V per head).  `ring`:
    a per-request ring of compressor rows (vLLM's CircularBufferSpec: one block per request, never shared;
    hkv's scratch role), whose block need not be a whole number of hkv blocks.  `state`: a linear layer's
    recurrent state laid out per block column (vLLM's MambaSpec in align mode; hkv's state role), its page the
    group's block (`num_kv_heads` x `head_dim` pairs of `kv_dtype` per token give its bytes)."""

    window_tokens: int
    tokens_per_page: int
    kv_dtype: str
    num_kv_heads: int
    head_dim: int
    ring: bool = False
    state: bool = False

    @property
    def geometry(self) -> tuple[int, int, str, int, int, bool, bool]:
        return (self.window_tokens, self.tokens_per_page, self.kv_dtype, self.num_kv_heads, self.head_dim, self.ring,
                self.state)


def engine_layout(groups: Sequence[EngineGroup], *, name: str, block_tokens: int, alignment_bytes: int,
                  source: str, pool_per_group: bool = False) -> tuple[Layout, tuple[str, ...]]:
    """The layout of an engine's cache groups, and the hkv pool of each group (ConfigError, naming the group's
    index as its key, for a group hkv cannot hold).  Groups of one geometry share a pool, unless
    `pool_per_group` (an engine whose groups draw blocks from one shared space, each block one group's: every
    group its own pool, so that an hkv page is one engine block)."""
    if not isinstance(groups, Sequence) or not 1 <= len(groups) <= LAYERS_MAX:
        raise ConfigError(f"must list 1 to {LAYERS_MAX} engine groups", source=source, key="groups")
    _check_count(block_tokens, "block_tokens", BLOCK_TOKENS_MAX, source)
    _check_count(alignment_bytes, "alignment_bytes", ALIGNMENT_BYTES_MAX, source)
    for i, group in enumerate(groups):
        _check_group(i, group, block_tokens, source)
    keys = [(g.geometry, i if pool_per_group else 0) for i, g in enumerate(groups)]
    distinct = list(dict.fromkeys(keys))
    members = {key: tuple(i for i, k in enumerate(keys) if k == key) for key in distinct}
    names = _group_names([key[0] for key in distinct])
    layer_groups = tuple(_layer_group(names[n], key[0], members[key]) for n, key in enumerate(distinct))
    pools = tuple(_pool(lg, key[0], alignment_bytes, source)
                  for lg, key in zip(layer_groups, distinct, strict=True))
    first = groups[0]
    layout = Layout(
        name=name, source=source, model_type=ENGINE_MODEL_TYPE, family="standard", main_layers=len(groups),
        mtp_layers=0, hidden_size=first.num_kv_heads * first.head_dim, num_attention_heads=first.num_kv_heads,
        num_key_value_heads=first.num_kv_heads, head_dim=first.head_dim, rope_head_dim=0, vocab_size=2,
        kv_dtype=first.kv_dtype, window_tokens=max(g.window_tokens for g in groups), block_tokens=block_tokens,
        alignment_bytes=alignment_bytes, groups=layer_groups, mtp_groups=(), pools=pools, mtp_pools=(),
    )
    pool_of = {key: pool.name for key, pool in zip(distinct, pools, strict=True)}
    return layout, tuple(pool_of[key] for key in keys)


def _check_count(value: object, key: str, maximum: int, source: str) -> None:
    if type(value) is not int or not 1 <= value <= maximum:
        raise ConfigError(f"must be an int in [1, {maximum}], got {value!r}", source=source, key=key)


def _check_group(i: int, group: object, block_tokens: int, source: str) -> None:
    key = f"groups[{i}]"
    if not isinstance(group, EngineGroup):
        raise ConfigError(f"must be an EngineGroup, got {type(group).__name__}", source=source, key=key)
    for field, maximum in (("tokens_per_page", BLOCK_TOKENS_MAX), ("num_kv_heads", HEADS_MAX),
                           ("head_dim", HEAD_DIM_MAX)):
        _check_count(getattr(group, field), f"{key}.{field}", maximum, source)
    window = group.window_tokens
    if type(window) is not int or window == 1 or not 0 <= window <= WINDOW_TOKENS_MAX:
        raise ConfigError(f"window_tokens must be 0 or an int in [2, {WINDOW_TOKENS_MAX}], got {window!r}",
                          source=source, key=key)
    if group.kv_dtype not in DTYPE_BYTES:
        raise ConfigError(f"kv_dtype must be one of {', '.join(DTYPE_BYTES)}, got {group.kv_dtype!r}",
                          source=source, key=key)
    for flag, why in ((group.ring and window, "a ring has no window"),
                      (group.state and window, "state columns have no window"),
                      (group.ring and group.state, "a group is a ring or state columns, not both")):
        if flag:
            raise ConfigError(why, source=source, key=key)
    if group.tokens_per_page % block_tokens and not group.ring:
        raise ConfigError(f"a page of {group.tokens_per_page} tokens is not a whole number of hkv blocks of "
                          f"{block_tokens} tokens", source=source, key=key)


Geometry = tuple[int, int, str, int, int, bool, bool]


def _group_names(geometries: list[Geometry]) -> list[str]:
    """Per layer group (by its geometry): `full` / `swa` / `ring` / `state`, numbered in order where one kind
    has several."""
    names = [""] * len(geometries)
    kind_of = [("ring" if geo[5] else "state" if geo[6] else "swa" if geo[0] else "full") for geo in geometries]
    for kind in ("full", "swa", "ring", "state"):
        ofkind = [i for i, k in enumerate(kind_of) if k == kind]
        for n, i in enumerate(ofkind):
            names[i] = kind if len(ofkind) == 1 else f"{kind}{n}"
    return names


def _layer_group(name: str, geo: Geometry, layers: tuple[int, ...]) -> LayerGroup:
    window, tokens, dtype, heads, dim = geo[:5]
    if geo[6]:  # the engine's state of one block: its bytes, as one recurrent state (its parts are the engine's)
        state = RecurrentShape(mixer="engine", conv_shape=(1,), conv_dtype=dtype,
                               ssm_shape=(max(1, tokens * 2 * heads * dim - 1),), ssm_dtype=dtype)
        return LayerGroup(name=name, kind=AttentionKind.LINEAR, compress_ratio=0, layer_ids=layers, window_tokens=0,
                          state=state)
    kind, ratio = (AttentionKind.SWA, WINDOW_RATIO) if window else (AttentionKind.FULL, FULL_RATIO)
    return LayerGroup(name=name, kind=kind, compress_ratio=ratio, layer_ids=layers, window_tokens=window)


def _pool(group: LayerGroup, geo: Geometry, alignment_bytes: int, source: str) -> PoolSpec:
    window, tokens, dtype, heads, dim, ring, state = geo
    obj, entry = ((ObjectKind.COMPRESSOR_TAIL, EntryKind.RING_ROW) if ring
                  else (ObjectKind.RECURRENT_STATE, EntryKind.STATE_COLUMN) if state
                  else (ObjectKind.SWA_WINDOW, EntryKind.WINDOW_ROW) if window
                  else (ObjectKind.COMPRESSED_KV, EntryKind.COMPRESSED_ENTRY))
    pool = make_pool(group, obj, entry, dtype=dtype, entry_shape=(2, heads, dim), base_entries=tokens,
                     alignment_bytes=alignment_bytes)
    if pool.tokens_per_page != tokens:
        raise ConfigError(f"a page of {tokens} tokens of {pool.entry_bytes} bytes each is not a multiple of "
                          f"alignment_bytes {alignment_bytes}", source=source, key=f"groups[{group.layer_ids[0]}]")
    return pool
