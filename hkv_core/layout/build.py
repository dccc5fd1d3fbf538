"""Turn a validated ``ModelConfig`` into layer groups and their pool specs."""

from __future__ import annotations

import math
from collections.abc import Sequence

from hkv_core import units
from hkv_core.layout.config import ModelConfig
from hkv_core.layout.kinds import (
    KIND_ORDER,
    TAIL_DTYPE,
    TAIL_ROW_PARTS,
    AttentionKind,
    EntryKind,
    ObjectKind,
    attention_kind,
)
from hkv_core.layout.records import LayerGroup, PoolSpec, make_pool

MTP_PREFIX = "mtp"


def build_groups(cfg: ModelConfig, *, draft: bool) -> tuple[LayerGroup, ...]:
    """Group the main (or, with ``draft``, the MTP) layers by identical geometry.

    Groups come in canonical order (SWA, CSA, HCA, FULL, then ratio, window) and
    are named by kind (``swa``, ``csa``, ...); ``_r{ratio}_w{window}`` is appended
    when one kind has several groups, and ``mtp_`` prefixes draft groups.
    """
    g = cfg.geometry
    first = cfg.main_layers if draft else 0
    last = first + (cfg.mtp_layers if draft else cfg.main_layers)
    members: dict[tuple[int, int, int], list[int]] = {}
    for layer in range(first, last):
        ratio, window = g.layer_ratios[layer], g.layer_windows[layer]
        kind = AttentionKind.LINEAR if layer in g.linear_layers else attention_kind(ratio)
        order = KIND_ORDER.index(kind)
        members.setdefault((order, ratio, window), []).append(layer)
    keys = sorted(members)
    groups = tuple(_group(cfg, key, members[key], _name(key, keys, draft), draft) for key in keys)
    assert sum(group.layer_count for group in groups) == last - first
    return groups


def _name(key: tuple[int, int, int], keys: Sequence[tuple[int, int, int]], draft: bool) -> str:
    order, ratio, window = key
    name = KIND_ORDER[order].value.lower()
    if sum(1 for other in keys if other[0] == order) > 1:
        name = f"{name}_r{ratio}_w{window}"
    return f"{MTP_PREFIX}_{name}" if draft else name


def _group(
    cfg: ModelConfig, key: tuple[int, int, int], layers: list[int], name: str, draft: bool
) -> LayerGroup:
    order, ratio, window = key
    kind = KIND_ORDER[order]
    if kind is AttentionKind.LINEAR:
        return LayerGroup(name=name, kind=kind, compress_ratio=0, layer_ids=tuple(layers), window_tokens=0,
                          draft=draft, state=cfg.geometry.state)
    heads, dim, topk = cfg.geometry.index if ratio == cfg.geometry.indexed_ratio else (0, 0, 0)
    return LayerGroup(
        name=name, kind=kind, compress_ratio=ratio, layer_ids=tuple(layers),
        window_tokens=window, index_n_heads=heads, index_head_dim=dim, index_topk=topk,
        draft=draft,
    )


def build_pools(cfg: ModelConfig, groups: Sequence[LayerGroup]) -> tuple[PoolSpec, ...]:
    """Every pool the groups need, group by group."""
    pools = tuple(pool for group in groups for pool in group_pools(cfg, group))
    assert len({pool.name for pool in pools}) == len(pools), "pool names must be unique"
    return pools


def group_pools(cfg: ModelConfig, group: LayerGroup) -> tuple[PoolSpec, ...]:
    """Pools of one group (``docs/v4_cache.md`` section 6).

    - ``compressed_kv`` for r >= 1 (FULL stores raw KV here with r = 1): a page
      spans a whole number of blocks and of entries (lcm(block, r) tokens at least);
    - ``compressor_tail`` for r >= 4: fp32 rows (a, z), each c*d wide; a page
      holds at least the largest tail (overlap + r - 1 rows) of one resume point;
    - ``swa_window`` when the layer keeps a window: raw KV rows, a block per page;
    - ``indexer_state`` for a group with an indexer: indexer keys (like compressed
      entries, width index_head_dim) and, for CSA, the indexer compressor tail
      (like the main tail; DeepSeek-V3.2's full layers keep a key per token, no tail);
    - ``recurrent_state`` for a LINEAR group: its convolution state and its SSM state, one entry each (the
      whole state at a resume point), a snapshot page per point like a tail.
    Every page is rounded up to a multiple of the alignment.
    """
    if group.state is not None:
        state = group.state
        return tuple(
            make_pool(group, ObjectKind.RECURRENT_STATE, entry, dtype=dtype, entry_shape=shape, base_entries=1,
                      alignment_bytes=cfg.alignment_bytes)
            for entry, dtype, shape in ((EntryKind.CONV_STATE, state.conv_dtype, state.conv_shape),
                                        (EntryKind.SSM_STATE, state.ssm_dtype, state.ssm_shape)))
    r, kv_dtype, kv_shape = group.compress_ratio, cfg.kv_dtype, cfg.geometry.kv_entry_shape
    entries_base = math.lcm(cfg.block_tokens, r) // r if r else 0
    tail_base = units.tail_rows_max(r) + 1
    c = units.overlap_factor(r)
    specs: list[tuple[ObjectKind, EntryKind, str, tuple[int, ...], int]] = []
    if r >= 1:
        specs.append((ObjectKind.COMPRESSED_KV, EntryKind.COMPRESSED_ENTRY, kv_dtype, kv_shape,
                      entries_base))
    if units.tail_rows_max(r):
        specs.append((ObjectKind.COMPRESSOR_TAIL, EntryKind.TAIL_ROW, TAIL_DTYPE,
                      (TAIL_ROW_PARTS, c * cfg.geometry.head_dim), tail_base))
    if group.window_tokens:
        specs.append((ObjectKind.SWA_WINDOW, EntryKind.WINDOW_ROW, kv_dtype, kv_shape,
                      cfg.block_tokens))
    if group.has_indexer:
        specs.append((ObjectKind.INDEXER_STATE, EntryKind.COMPRESSED_ENTRY, kv_dtype,
                      (group.index_head_dim,), entries_base))
    if group.has_indexer and units.tail_rows_max(r):
        specs.append((ObjectKind.INDEXER_STATE, EntryKind.TAIL_ROW, TAIL_DTYPE,
                      (TAIL_ROW_PARTS, c * group.index_head_dim), tail_base))
    assert specs, f"group {group.name} needs no state"
    return tuple(
        make_pool(group, obj, entry, dtype=dtype, entry_shape=shape, base_entries=base,
                  alignment_bytes=cfg.alignment_bytes)
        for obj, entry, dtype, shape, base in specs
    )
