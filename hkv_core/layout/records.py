"""Frozen records of a layout: layer groups and the pool spec of each (group, object kind)."""

from __future__ import annotations

import math

import attrs

from hkv_core import units
from hkv_core.layout.kinds import (
    COMPONENTS,
    DTYPE_BYTES,
    SNAPSHOT_ENTRIES,
    STATE_ENTRIES,
    AttentionKind,
    EntryKind,
    ObjectKind,
    attention_kind,
)

ABI_VERSION = 1  # bump when the byte layout of any pool changes


@attrs.frozen(kw_only=True)
class RecurrentShape:
    """The recurrent state one linear-attention / state-space layer keeps, whatever the prompt length.

    ``conv_shape``: the short convolution's state (channels, kernel - 1: the last kernel - 1 inputs), in
    ``conv_dtype``; ``ssm_shape``: the recurrent state (Mamba's SSM state, Gated DeltaNet's / KDA's delta-rule
    matrix) in ``ssm_dtype``.  ``mixer`` names the layer (``gated_deltanet``, ``kda``, ``mamba``, ``mamba2``).
    """

    mixer: str
    conv_shape: tuple[int, ...]
    conv_dtype: str
    ssm_shape: tuple[int, ...]
    ssm_dtype: str

    def __attrs_post_init__(self) -> None:
        assert self.conv_dtype in DTYPE_BYTES and self.ssm_dtype in DTYPE_BYTES, self
        assert min(self.conv_shape + self.ssm_shape) >= 1, self

    @property
    def bytes_per_layer(self) -> int:
        """Bytes of one layer's whole state (convolution and recurrent)."""
        return (math.prod(self.conv_shape) * DTYPE_BYTES[self.conv_dtype]
                + math.prod(self.ssm_shape) * DTYPE_BYTES[self.ssm_dtype])


@attrs.frozen(kw_only=True)
class LayerGroup:
    """Layers with identical cache geometry (same kind, compress ratio and window).

    ``window_tokens`` is the sliding window W (0: the layer keeps no window).
    ``index_*`` describe the lightning indexer: every CSA group has one (DeepSeek-V4), full-attention groups
    have one in DeepSeek-V3.2 (one key per token), other groups none (0).
    ``draft`` marks MTP / draft layers, whose state is needed only when speculating.
    ``state`` describes a LINEAR group's recurrent state per layer (empty for attention groups).
    """

    name: str
    kind: AttentionKind
    compress_ratio: int
    layer_ids: tuple[int, ...]
    window_tokens: int
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    draft: bool = False
    state: RecurrentShape | None = None

    def __attrs_post_init__(self) -> None:
        linear = self.kind is AttentionKind.LINEAR
        assert linear == (self.state is not None), self
        assert linear or attention_kind(self.compress_ratio) is self.kind, (self.kind, self.compress_ratio)
        assert not linear or (self.compress_ratio, self.window_tokens) == (0, 0), self
        assert self.layer_ids and list(self.layer_ids) == sorted(set(self.layer_ids)), self
        assert self.window_tokens == 0 or self.window_tokens >= 2, self.window_tokens
        index = (self.index_n_heads, self.index_head_dim, self.index_topk)
        assert min(index) > 0 or max(index) == 0, index  # an indexer is given whole or not at all
        if self.kind is AttentionKind.CSA or self.has_indexer:
            assert self.has_indexer and self.kind in (AttentionKind.CSA, AttentionKind.FULL), self

    @property
    def layer_count(self) -> int:
        """Number of layers in the group."""
        return len(self.layer_ids)

    @property
    def has_indexer(self) -> bool:
        """True for groups with a lightning indexer: CSA groups keep indexer keys and an indexer compressor
        tail, DeepSeek-V3.2's full-attention groups one indexer key per token."""
        return min(self.index_n_heads, self.index_head_dim, self.index_topk) > 0


@attrs.frozen(kw_only=True, cache_hash=True)
class PoolSpec:
    """Geometry of one pool: the pages of one (group, object kind, entry kind).

    Sizes are per layer: a page id names the same slot in every layer of the
    group, so one page of the pool occupies ``page_bytes * layer_count`` bytes.
    ``tokens_per_page`` is ``entries_per_page * compress_ratio`` for compressed
    entries and ``entries_per_page`` for rows (one row per token).  ``abi_id``
    names the exact memory layout a kernel expects.
    """

    name: str
    group_name: str
    object_kind: ObjectKind
    entry_kind: EntryKind
    compress_ratio: int
    layer_count: int
    dtype: str
    entry_shape: tuple[int, ...]
    entry_bytes: int
    entries_per_page: int
    tokens_per_page: int
    page_bytes: int
    alignment_bytes: int
    abi_id: str

    def __attrs_post_init__(self) -> None:
        assert (self.object_kind, self.entry_kind) in COMPONENTS, self
        assert self.entry_bytes == math.prod(self.entry_shape) * DTYPE_BYTES[self.dtype]
        assert self.page_bytes == self.entries_per_page * self.entry_bytes
        assert self.page_bytes % self.alignment_bytes == 0, self
        assert self.tokens_per_page == self.entries_per_page * self.tokens_per_entry, self

    @property
    def tokens_per_entry(self) -> int:
        """Tokens one entry covers: r for compressed entries, 1 for rows."""
        if self.entry_kind is EntryKind.COMPRESSED_ENTRY:
            return units.tokens_per_entry(self.compress_ratio)
        return units.TOKENS_PER_ROW

    @property
    def bytes_per_token(self) -> float:
        """Bytes this pool holds per token it covers, summed over the group's layers (0 for a recurrent
        state: its size does not grow with the tokens it summarises)."""
        if self.entry_kind in STATE_ENTRIES:
            return 0.0
        return self.entry_bytes * self.layer_count / self.tokens_per_entry

    @property
    def snapshot(self) -> bool:
        """A point-snapshot pool (compressor tail rows, recurrent state): one page per retained resume point
        holds exactly what a resume at its position reads."""
        return self.entry_kind in SNAPSHOT_ENTRIES

    def point_entries(self, prefix_tokens: int) -> int:
        """Entries of a snapshot pool a resume at P reads (rows [0, n) of the snapshot page)."""
        assert self.snapshot, self
        if self.entry_kind in STATE_ENTRIES:
            return units.state_entries(prefix_tokens)
        return units.tail_rows(prefix_tokens, self.compress_ratio)

    def point_start_token(self, prefix_tokens: int) -> int:
        """Where a snapshot at P starts: two ends whose snapshots start at the same token in every member
        pool may share one page (tails); a recurrent state starts at P itself, so they never do."""
        assert self.snapshot, self
        if self.entry_kind in STATE_ENTRIES:
            return units.state_start_token(prefix_tokens)
        return units.tail_start_token(prefix_tokens, self.compress_ratio)


def make_pool(
    group: LayerGroup,
    object_kind: ObjectKind,
    entry_kind: EntryKind,
    *,
    dtype: str,
    entry_shape: tuple[int, ...],
    base_entries: int,
    alignment_bytes: int,
) -> PoolSpec:
    """Build a pool spec: entries per page is the smallest multiple of ``base_entries``
    whose page bytes are a multiple of ``alignment_bytes``."""
    component = COMPONENTS[(object_kind, entry_kind)]
    entry_bytes = math.prod(entry_shape) * DTYPE_BYTES[dtype]
    entries = units.aligned_entries_per_page(base_entries, entry_bytes, alignment_bytes)
    per_entry = group.compress_ratio if entry_kind is EntryKind.COMPRESSED_ENTRY else 1
    shape = ",".join(str(n) for n in entry_shape)
    return PoolSpec(
        name=f"{group.name}.{component}",
        group_name=group.name,
        object_kind=object_kind,
        entry_kind=entry_kind,
        compress_ratio=group.compress_ratio,
        layer_count=group.layer_count,
        dtype=dtype,
        entry_shape=entry_shape,
        entry_bytes=entry_bytes,
        entries_per_page=entries,
        tokens_per_page=units.tokens_per_page(entries, per_entry),
        page_bytes=units.bytes_for_entries(entries, entry_bytes),
        alignment_bytes=alignment_bytes,
        abi_id=f"{component}/{dtype}/[{shape}]/e{entries}/v{ABI_VERSION}",
    )
