"""The exact state needed to resume a prefix of P tokens (``docs/v4_cache.md`` section 6).

The first new token is at position P.  Per layer (identical within a group):

- compressed entries ``K_j``, ``j < floor(P / r)`` (r >= 1);
- CSA: indexer keys ``KI_j`` for the same j, and both compressor tails;
- compressor tail: rows of positions ``[r * floor(P / r) - overlap, P)``: for
  r = 4 the 4 overlap rows of the previous complete block (the padding
  sentinel a = 0, z = -inf while P < 4) plus ``P mod 4`` remainder rows; for
  r >= 8 ``P mod r`` rows;
- sliding window: raw KV of positions ``[max(0, P - W + 1), P)``;
- a linear-attention / state-space layer: its whole recurrent state (convolution
  and SSM state) as it was after token P - 1, one entry per pool (none at P = 0).
"""

from __future__ import annotations

import attrs

from hkv_core import units
from hkv_core.layout.kinds import AttentionKind, EntryKind
from hkv_core.layout.model import Layout
from hkv_core.layout.records import LayerGroup, PoolSpec


@attrs.frozen(kw_only=True)
class TailRows:
    """Compressor tail rows of one layer: ``overlap + remainder == total``.

    ``start_token`` is the position of the first row (``P - total``); negative
    positions are padding-sentinel rows (``padding`` of them), never real tokens.
    """

    overlap: int
    remainder: int
    total: int
    start_token: int
    padding: int

    def __attrs_post_init__(self) -> None:
        assert self.overlap + self.remainder == self.total, self
        assert 0 <= self.padding <= self.overlap, self


@attrs.frozen(kw_only=True)
class PoolNeed:
    """How much of one pool one layer needs: entries (or rows) and their bytes."""

    pool_name: str
    entries: int
    bytes: int


@attrs.frozen(kw_only=True)
class GroupRequirements:
    """State one layer of ``group_name`` needs at P; every layer of the group needs the same.

    ``compressed_tokens`` / ``window_token_range`` are half-open ``[start, end)``.
    """

    group_name: str
    kind: AttentionKind
    compress_ratio: int
    layer_ids: tuple[int, ...]
    compressed_entries: int
    compressed_tokens: tuple[int, int]
    indexer_keys: int
    tail: TailRows
    indexer_tail: TailRows | None
    window_rows: int
    window_token_range: tuple[int, int]
    state_entries: int  # recurrent-state entries per pool (a LINEAR group: 1 for P > 0)
    pools: tuple[PoolNeed, ...]
    bytes_per_layer: int
    bytes: int

    def __attrs_post_init__(self) -> None:
        assert self.bytes_per_layer == sum(need.bytes for need in self.pools), self
        assert self.bytes == self.bytes_per_layer * len(self.layer_ids), self
        assert self.window_token_range[1] - self.window_token_range[0] == self.window_rows


@attrs.frozen(kw_only=True)
class ResumeRequirements:
    """Everything needed to resume ``layout_name`` at ``prefix_tokens``.

    ``groups`` cover the main layers; ``mtp_groups`` the draft (MTP) layers, needed
    only when speculating and not counted in ``bytes``.
    """

    layout_name: str
    prefix_tokens: int
    groups: tuple[GroupRequirements, ...]
    mtp_groups: tuple[GroupRequirements, ...]
    bytes: int
    mtp_bytes: int

    def for_layer(self, layer_id: int) -> GroupRequirements:
        """The requirements of layer ``layer_id`` (those of its group)."""
        found = [g for g in self.groups + self.mtp_groups if layer_id in g.layer_ids]
        if not found:
            raise KeyError(layer_id)
        return found[0]


def resume_requirements(layout: Layout, prefix_tokens: int) -> ResumeRequirements:
    """The state each group and layer of ``layout`` needs to resume at ``prefix_tokens``."""
    p = units.as_count("prefix_tokens", prefix_tokens)
    groups = tuple(_group(layout, group, p) for group in layout.groups)
    mtp = tuple(_group(layout, group, p) for group in layout.mtp_groups)
    return ResumeRequirements(
        layout_name=layout.name, prefix_tokens=p, groups=groups, mtp_groups=mtp,
        bytes=sum(g.bytes for g in groups), mtp_bytes=sum(g.bytes for g in mtp),
    )


def tail_rows_at(prefix_tokens: int, ratio: int) -> TailRows:
    """The compressor tail rows of a layer of ratio ``ratio`` at P."""
    return TailRows(
        overlap=units.tail_overlap_rows(ratio),
        remainder=units.tail_remainder_rows(prefix_tokens, ratio),
        total=units.tail_rows(prefix_tokens, ratio),
        start_token=units.tail_start_token(prefix_tokens, ratio),
        padding=units.tail_padding_rows(prefix_tokens, ratio),
    )


def _group(layout: Layout, group: LayerGroup, p: int) -> GroupRequirements:
    r, w = group.compress_ratio, group.window_tokens
    entries = units.compressed_entries(p, r)
    covered_tokens = units.entry_tokens(entries, r) if r else 0
    tail = tail_rows_at(p, r)
    counts = {
        EntryKind.COMPRESSED_ENTRY: entries,
        EntryKind.TAIL_ROW: tail.total,
        EntryKind.WINDOW_ROW: units.window_rows(p, w),
        EntryKind.CONV_STATE: units.state_entries(p),
        EntryKind.SSM_STATE: units.state_entries(p),
    }
    pools = tuple(_need(pool, counts[pool.entry_kind]) for pool in layout.pools_of(group.name))
    per_layer = sum(need.bytes for need in pools)
    return GroupRequirements(
        group_name=group.name, kind=group.kind, compress_ratio=r, layer_ids=group.layer_ids,
        compressed_entries=entries, compressed_tokens=(0, covered_tokens),
        indexer_keys=entries if group.has_indexer else 0, tail=tail,
        indexer_tail=tail if group.has_indexer and units.tail_rows_max(r) else None,
        window_rows=units.window_rows(p, w),
        window_token_range=(units.window_start_token(p, w), p),
        state_entries=units.state_entries(p) if group.state is not None else 0,
        pools=pools, bytes_per_layer=per_layer, bytes=per_layer * group.layer_count,
    )


def _need(pool: PoolSpec, entries: int) -> PoolNeed:
    return PoolNeed(pool_name=pool.name, entries=entries,
                    bytes=units.bytes_for_entries(entries, pool.entry_bytes))

