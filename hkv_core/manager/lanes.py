"""Page pools of the manager: the layout's pools grouped by what moves in lockstep.

The layout has one pool per (layer group, object kind, entry kind); an
executor allocates each as one array.  The manager groups pools whose pages
always move together into one page pool with one id space: the windows of
every layer group with the same window (a block's window rows exist in every
group at once), the compressor tails of every group (one snapshot per resume
point), and prefix pools of the same kind and page geometry.  A page id then
names the same page in every member pool, like a page id already names the
same slot in every layer of a group, and one lifecycle step moves all of them
(DeepSeek-V4-Flash: 9 pools, 6 page pools).

A page pool's role (prefix, window, tail) is selected by (object kind, entry
kind) through the table ROLE_OF, never by if-chains.
"""

from __future__ import annotations

import enum

import attrs

from hkv_core.errors import ConfigError
from hkv_core.layout import EntryKind, Layout, ObjectKind, PoolSpec
from hkv_core.manager.config import ManagerConfig


class PoolRole(enum.Enum):
    """What a page pool's pages are to a resume point."""

    PREFIX = "prefix"  # entries for all of [0, P): compressed KV, indexer keys
    WINDOW = "window"  # raw rows of one or more blocks: needed for [P - W + 1, P)
    TAIL = "tail"  # one snapshot page per resume point: compressor rows, or a linear layer's state, at P
    SCRATCH = "scratch"  # one page per request for its life, never shared: an engine's compressor ring
    STATE = "state"  # one page per block column, the state at the block's end where a step ended: an engine's Mamba


ROLE_OF: dict[tuple[ObjectKind, EntryKind], PoolRole] = {
    (ObjectKind.COMPRESSED_KV, EntryKind.COMPRESSED_ENTRY): PoolRole.PREFIX,
    (ObjectKind.INDEXER_STATE, EntryKind.COMPRESSED_ENTRY): PoolRole.PREFIX,
    (ObjectKind.SWA_WINDOW, EntryKind.WINDOW_ROW): PoolRole.WINDOW,
    (ObjectKind.COMPRESSOR_TAIL, EntryKind.TAIL_ROW): PoolRole.TAIL,
    (ObjectKind.INDEXER_STATE, EntryKind.TAIL_ROW): PoolRole.TAIL,
    (ObjectKind.RECURRENT_STATE, EntryKind.CONV_STATE): PoolRole.TAIL,
    (ObjectKind.RECURRENT_STATE, EntryKind.SSM_STATE): PoolRole.TAIL,
    (ObjectKind.COMPRESSOR_TAIL, EntryKind.RING_ROW): PoolRole.SCRATCH,
    (ObjectKind.RECURRENT_STATE, EntryKind.STATE_COLUMN): PoolRole.STATE,
}


@attrs.frozen(kw_only=True)
class LaneSpec:
    """One page pool: its member pools (same page ids), role, lifecycle kind and geometry.

    `pages` counts the NULL page (the objects it may hold: with a shared
    block space, its cap); `slots` its page ids, NULL included (the shared
    space's, else `pages`); `tokens_per_page` and `compress_ratio` are
    the members' (equal within a prefix page pool); `window_tokens` is the
    members' window (window pools) and 0 otherwise.
    """

    index: int
    name: str
    role: PoolRole
    kind: str
    members: tuple[PoolSpec, ...]
    pages: int
    tokens_per_page: int
    entries_per_page: int
    compress_ratio: int
    window_tokens: int
    slots: int

    @property
    def member_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members)

    @property
    def block_column(self) -> bool:
        """Every indexed block refers to one object of this pool (prefix pools)."""
        return self.role is PoolRole.PREFIX

    @property
    def point_snapshot(self) -> bool:
        """Every resume point holds one object of this pool (tail and state pools: the state at its position)."""
        return self.role in (PoolRole.TAIL, PoolRole.STATE)

    @property
    def state_columns(self) -> bool:
        """A request computes in one page per block column (state pools), not in one working page (tails)."""
        return self.role is PoolRole.STATE


def _lane_key(spec: PoolSpec, role: PoolRole, pages: int, window: int) -> tuple[object, ...]:
    """Pools with equal keys share one page-id space."""
    if role is PoolRole.PREFIX:
        return role, spec.object_kind, spec.compress_ratio, spec.entries_per_page, spec.tokens_per_page, pages
    if role is PoolRole.WINDOW:
        return role, spec.object_kind, spec.tokens_per_page, window, pages
    return role, spec.object_kind, pages


def managed_pools(layout: Layout, config: ManagerConfig) -> tuple[PoolSpec, ...]:
    """The layout pools a manager with `config` manages, in layout order: the main layers' pools, plus the
    MTP layers' pools when `config.mtp_window` (their window pools join the window page pools)."""
    return layout.pools + layout.mtp_pools if config.mtp_window else layout.pools


def build_lanes(layout: Layout, config: ManagerConfig) -> tuple[LaneSpec, ...]:
    """The page pools of `layout` (in layout pool order of their first member), sizes from `config`;
    ConfigError when `config.pool_pages` names a pool the manager does not manage."""
    pools = managed_pools(layout, config)
    known = [spec.name for spec in pools]
    unknown = sorted(set(config.pool_pages) - set(known))
    if unknown:
        mtp = " (MTP pools are managed only with mtp_window=True)" if any(
            spec.name in unknown for spec in layout.mtp_pools) else ""
        raise ConfigError(f"no pool {', '.join(map(repr, unknown))} in layout {layout.name!r}; its pools: "
                          f"{', '.join(known)}{mtp}", source="ManagerConfig", key="pool_pages")
    groups: dict[tuple[object, ...], list[PoolSpec]] = {}
    for spec in pools:
        role = ROLE_OF[(spec.object_kind, spec.entry_kind)]
        window = layout.group(spec.group_name).window_tokens
        _check_geometry(spec, role, layout.block_tokens)
        key = (spec.name,) if config.shared_pages else _lane_key(spec, role, config.pages_of(spec.name), window)
        groups.setdefault(key, []).append(spec)  # in a shared space a block is one pool's page: no lanes merge
    lanes = []
    for index, members in enumerate(groups.values()):
        first = members[0]
        role = ROLE_OF[(first.object_kind, first.entry_kind)]
        name = first.name if len(members) == 1 else "+".join(m.name for m in members)
        lanes.append(LaneSpec(index=index, name=name, role=role, kind=first.object_kind.value,
                              members=tuple(members), pages=config.pages_of(first.name) + 1,
                              tokens_per_page=first.tokens_per_page, entries_per_page=first.entries_per_page,
                              compress_ratio=first.compress_ratio,
                              window_tokens=layout.group(first.group_name).window_tokens
                              if role is PoolRole.WINDOW else 0, slots=config.slots_of(first.name) + 1))
    return tuple(lanes)


def _check_geometry(spec: PoolSpec, role: PoolRole, block_tokens: int) -> None:
    tokens = spec.tokens_per_page
    if role is PoolRole.PREFIX and tokens % block_tokens:
        raise ConfigError(f"tokens per page {tokens} is not a multiple of block_tokens {block_tokens}",
                          source=spec.name, key="tokens_per_page")
    if role in (PoolRole.WINDOW, PoolRole.STATE) and tokens % block_tokens:
        raise ConfigError(f"window pages must hold a whole number of blocks ({block_tokens} rows each), not "
                          f"{tokens} rows", source=spec.name, key="tokens_per_page")
