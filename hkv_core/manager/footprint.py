"""The host memory a CacheManager's tables take, computed from the layout and the config before any exists.

Every table a manager allocates at construction (or at first use, and keeps)
has a size fixed by its capacities (`limits.py`): per object of every page
pool, per page, per block row, per resume-point row, per key-table slot, per
LRU queue entry, per request slot.  `estimate_metadata(layout, config)` adds
them up from the same figures the tables are built from, with no array
allocated, so an engine can size a config before building it; `Core` checks
the total against `ManagerConfig.max_metadata_bytes` first and raises
`MetadataTooLarge` rather than running out of memory part-way.

Not counted: what grows with a request's tokens (its token ids, keys, chain
and page tables, bounded by `max_request_tokens`), copy plans in flight,
cache events, the chain memo (`CHAIN_MEMO_ENTRIES`, at most 512 KiB) and the
compiled lifecycle tables (a few KiB).  A test holds the estimate within 1 %
(plus 64 KiB) of the bytes of a built manager's arrays.

`estimate_device_bytes(layout, config)` is the same for the executor's side:
the bytes of every pool `CacheManager(layout, config).bindings()` would hand an
executor to allocate, per pool and role, with no manager built.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import attrs

from hkv_core.errors import MetadataTooLarge
from hkv_core.executor import DeviceEstimate, PoolBinding, device_estimate
from hkv_core.layout import Layout
from hkv_core.manager.config import ManagerConfig
from hkv_core.manager.lanes import LaneSpec, build_lanes, managed_pools
from hkv_core.manager.limits import Limits, object_count
from hkv_core.manager.roles.window import window_width

# Bytes per element, one figure per table, from the dtypes the tables are built with.
OBJECT_BYTES = 69  # page_pools.PagePools, per object: pool (8), code (1), version (8), leases, copies, holders,
# owner (4 each), row_token, full_token (8 each), slot (4), loads (4), stamp (8), vdrop (4)
PAGE_BYTES = 12  # page_pools.PoolSlots, per page: slot_object, free_slots, free_objects (4 each)
BLOCK_ROW_BYTES = 31  # index.BlockTable, per row: state (1), version (2), free_rows (4), key (16), parent, point (4)
POINT_ROW_BYTES = 15  # index.PointTable, per row: state (1), version, free_rows, block (4 each), flags (2)
REF_BYTES = 4  # one object reference of an index row (a block's prefix page, a point's window or snapshot page)
KEY_SLOT_BYTES = 8  # index.KeyTable, per slot: ids and the insert scratch (4 each)
QUEUE_ENTRY_BYTES = 4  # index.LruPolicy: per queue entry, and per block row (pos)
REQUEST_SLOT_BYTES = 24  # requests.RequestTable, per slot: committed (8), by_slot and free_slots (8 each)


@attrs.frozen(kw_only=True)
class MetadataEstimate:
    """Bytes per table of one manager (`tables`), their `total`, and the limit it is checked against."""

    tables: Mapping[str, int]
    limit_bytes: int

    @property
    def total(self) -> int:
        return sum(self.tables.values())

    @property
    def largest(self) -> tuple[str, int]:
        """(name, bytes) of the table that takes the most."""
        name = max(self.tables, key=lambda t: self.tables[t])
        return name, self.tables[name]

    @property
    def fits(self) -> bool:
        return self.total <= self.limit_bytes


def estimate_metadata(layout: Layout, config: ManagerConfig) -> MetadataEstimate:
    """What `CacheManager(layout, config)` would allocate, without allocating it (ConfigError for a capacity
    past its bound, as the constructor would)."""
    lanes = build_lanes(layout, config)
    return metadata_of(layout, config, lanes, Limits.of(layout, config, lanes))


def estimate_device_bytes(layout: Layout, config: ManagerConfig, *, padding: bool = False) -> DeviceEstimate:
    """The bytes of every pool an executor allocates for `CacheManager(layout, config)` (its `bindings()`), per
    pool, with each pool's role, without building the manager (ConfigError as the constructor would give for
    an unknown pool).  `padding`: add each pool's alignment, as CudaExecutor over-allocates."""
    lanes = build_lanes(layout, config)
    roles = {spec.name: lane.role.value for lane in lanes for spec in lane.members}
    bindings = [PoolBinding(spec=spec, pages=config.slots_of(spec.name) + 1) for spec in managed_pools(layout, config)]
    return device_estimate(bindings, padding=padding, roles=roles)


def metadata_of(layout: Layout, config: ManagerConfig, lanes: tuple[LaneSpec, ...], limits: Limits) -> MetadataEstimate:
    """The estimate from capacities already derived (what Core checks before it allocates)."""
    prefix_columns = sum(1 for lane in lanes if lane.block_column)
    point_refs = sum(window_width(lane.window_tokens, lane.tokens_per_page) for lane in lanes if lane.window_tokens)
    point_refs += sum(1 for lane in lanes if lane.point_snapshot)
    blocks, points = limits.block_rows, limits.point_rows
    tables = {
        "objects": OBJECT_BYTES * object_count(lanes),
        "pages": sum(PAGE_BYTES * max(lane.pages, lane.slots) - 8 for lane in lanes),  # free stacks skip NULL
        "block table": (BLOCK_ROW_BYTES + REF_BYTES * prefix_columns) * blocks,
        "resume-point table": (POINT_ROW_BYTES + REF_BYTES * point_refs) * points,
        "key table": KEY_SLOT_BYTES * limits.key_table_slots,
        "LRU queue": QUEUE_ENTRY_BYTES * (limits.lru_queue_entries + blocks),
        "requests": REQUEST_SLOT_BYTES * limits.max_requests + 8,
    }
    return MetadataEstimate(tables=MappingProxyType(tables), limit_bytes=config.metadata_limit())


def checked(layout: Layout, config: ManagerConfig, lanes: tuple[LaneSpec, ...], limits: Limits) -> MetadataEstimate:
    """The estimate, or MetadataTooLarge when it is past the config's limit (nothing allocated yet)."""
    found = metadata_of(layout, config, lanes, limits)
    if not found.fits:
        largest, largest_bytes = found.largest
        raise MetadataTooLarge(needed_bytes=found.total, limit_bytes=found.limit_bytes, largest=largest,
                               largest_bytes=largest_bytes)
    return found
