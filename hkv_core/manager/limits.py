"""Every limit of a CacheManager in one place: named constants, and the capacities of one manager.

Capacities are fixed at construction from the layout and the config; nothing
grows past them.  A page pool, the block table, the resume-point table, the
key table and the LRU queue are allocated once at their full size; a request
grows only up to `max_request_tokens` (its tables with it); requests in
flight are capped at `max_requests`.  When a table is full, allocation evicts
(blocks and points are evictable like pages) or refuses with OutOfPages; the
relations between the capacities are asserted here (docs/limits.md).  The
upper bound of every config size lives in config_bounds.py, so that
ManagerConfig checks them without importing this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from hkv_core.errors import ConfigError
from hkv_core.manager.config_bounds import (  # the config bounds this module relates
    MAX_BLOCK_ROWS,
    MAX_OBJECTS,
    MAX_POINT_ROWS,
)

if TYPE_CHECKING:  # annotations only
    from hkv_core.layout import Layout
    from hkv_core.manager.config import ManagerConfig
    from hkv_core.manager.lanes import LaneSpec

# -------------------------------------------------------------- named constants
QUEUE_CHUNK_ENTRIES = 256  # LRU queue entries an eviction walk screens first (doubling after)
MAX_QUEUE_CHUNK_ENTRIES = 65_536  # ... up to this many per NumPy round
QUEUE_SLACK_DIVISOR = 4  # LRU queue: one entry per block row, plus a quarter (stale entries until compacted)
KEY_TABLE_MIN_SLOTS = 1024  # smallest key table
KEY_TABLE_LOAD_NUM, KEY_TABLE_LOAD_DEN = 2, 3  # the key table stays at most 2/3 full
SEARCH_BLOCKS = 256  # match checks this many candidates below the longest first (x8 when none passes)
CHAIN_MEMO_ENTRIES = 64  # matched chains remembered by their last block (cleared by every block drop)
MIN_POOL_PAGES = 2  # the NULL page and one real page

assert QUEUE_CHUNK_ENTRIES <= MAX_QUEUE_CHUNK_ENTRIES and QUEUE_SLACK_DIVISOR >= 1
assert -(-MAX_BLOCK_ROWS * KEY_TABLE_LOAD_DEN // KEY_TABLE_LOAD_NUM) < 1 << 31, "int32 key table slots"
assert MAX_BLOCK_ROWS + MAX_BLOCK_ROWS // QUEUE_SLACK_DIVISOR < 1 << 31, "int32 LRU queue positions"
assert 0 < KEY_TABLE_LOAD_NUM < KEY_TABLE_LOAD_DEN
assert SEARCH_BLOCKS >= 1


@attrs.frozen(kw_only=True)
class Limits:
    """The capacities of one manager (see the module docstring)."""

    pool_pages: dict[str, int]  # per page pool, the NULL page included
    block_rows: int
    point_rows: int
    key_table_slots: int
    lru_queue_entries: int
    max_requests: int
    max_request_tokens: int

    def __attrs_post_init__(self) -> None:
        assert all(p >= MIN_POOL_PAGES for p in self.pool_pages.values()), self.pool_pages
        assert self.block_rows >= 1 and self.point_rows >= 1 and self.max_requests >= 1
        slots = self.key_table_slots
        assert slots >= KEY_TABLE_MIN_SLOTS
        assert slots * KEY_TABLE_LOAD_NUM >= self.block_rows * KEY_TABLE_LOAD_DEN, "key table load <= 2/3"
        assert self.lru_queue_entries == queue_entries(self.block_rows), "a compaction always leaves room"

    @classmethod
    def of(cls, layout: Layout, config: ManagerConfig, lanes: tuple[LaneSpec, ...]) -> Limits:
        """The capacities, or ConfigError when one is past its bound (derived ones included); scalars only:
        nothing is allocated here."""
        objects = object_count(lanes)
        if objects > MAX_OBJECTS:
            raise ConfigError(f"the pools hold {objects:,} objects together, more than {MAX_OBJECTS:,} (int32 ids)",
                              source="ManagerConfig", key="pool_pages")
        blocks = config.max_blocks or derived_block_rows(layout, config, lanes)
        if blocks > MAX_BLOCK_ROWS:
            raise ConfigError(f"the pools back {blocks:,} block rows, more than {MAX_BLOCK_ROWS:,}: "
                              f"set max_blocks (docs/limits.md)", source="ManagerConfig", key="max_blocks")
        points = config.max_points or derived_point_rows(config, lanes, blocks)
        if points > MAX_POINT_ROWS:
            raise ConfigError(f"{points:,} resume-point rows derived, more than {MAX_POINT_ROWS:,}: set max_points",
                              source="ManagerConfig", key="max_points")
        return cls(pool_pages={lane.name: lane.pages for lane in lanes}, block_rows=blocks, point_rows=points,
                   key_table_slots=key_table_slots(blocks), lru_queue_entries=queue_entries(blocks),
                   max_requests=config.max_requests, max_request_tokens=config.max_request_tokens)


def object_count(lanes: tuple[LaneSpec, ...]) -> int:
    """Objects of every pool together: one per real page, plus the NULL object."""
    return 1 + sum(lane.pages - 1 for lane in lanes)


def derived_block_rows(layout: Layout, config: ManagerConfig, lanes: tuple[LaneSpec, ...]) -> int:
    """Blocks the pools can back: every indexed block outside a live request's last pages refers to
    a page of the prefix pool with the shortest pages, so the index never needs more rows than that
    pool's pages cover (plus one such page per request in flight)."""
    spans = [((lane.pages - 1) * lane.tokens_per_page // layout.block_tokens, lane.tokens_per_page)
             for lane in lanes if lane.block_column]
    if spans:
        covered, page_tokens = min(spans)
        return covered + config.max_requests * max(1, page_tokens // layout.block_tokens)
    return max(lane.pages - 1 for lane in lanes) + config.max_requests


def derived_point_rows(config: ManagerConfig, lanes: tuple[LaneSpec, ...], block_rows: int) -> int:
    """Points retained every `retain_every_blocks` blocks, plus one prompt end (and one junction, with
    `retain_junction`) per request in flight, never more than a tail pool has pages for (each point holds one
    tail snapshot page)."""
    wanted = block_rows // config.retain_every_blocks + config.max_requests * (1 + config.retain_junction)
    tails = [lane.pages - 1 for lane in lanes if lane.point_snapshot]
    return max(1, min([wanted, *tails]))


def queue_entries(block_rows: int) -> int:
    """LRU queue entries: every live block once, plus room for stale entries between compactions."""
    return block_rows + max(1, block_rows // QUEUE_SLACK_DIVISOR)


def key_table_slots(block_rows: int) -> int:
    """The fewest slots (at least KEY_TABLE_MIN_SLOTS) that keep `block_rows` keys at most 2/3 full."""
    return max(KEY_TABLE_MIN_SLOTS, -(-block_rows * KEY_TABLE_LOAD_DEN // KEY_TABLE_LOAD_NUM))
