"""The upper bound of every size a ManagerConfig takes (ConfigError beyond; docs/limits.md).

Constants only, importing nothing: ManagerConfig checks its fields against
them, and limits.py (the capacities of one manager) re-exports them.
"""

from __future__ import annotations

MAX_POOL_PAGES = 1 << 28  # real pages of one pool (268,435,456)
MAX_OBJECTS = (1 << 31) - 1  # objects of every pool together, NULL included: ids are int32
MAX_REQUESTS = 1 << 16  # requests in flight (65,536)
MAX_REQUEST_TOKENS = 1 << 28  # tokens of one request (268,435,456)
MAX_BLOCK_ROWS = 1 << 28  # rows of the block table, given or derived (its ids, LRU entries and key slots are int32)
MAX_POINT_ROWS = 1 << 28  # rows of the resume-point table, given or derived
MAX_RETAIN_EVERY_BLOCKS = 1 << 28  # beyond a request's longest chain: only prompt ends are kept
MAX_DEVICE_ALIGNMENT_BYTES = 1 << 30  # device page alignment
MAX_PENDING_EVENTS = 1 << 20  # records of KV cache events waiting for take_events (each a few arrays)
METADATA_MEMORY_SHARE = 2  # default max_metadata_bytes: physical memory / this
METADATA_FALLBACK_BYTES = 8 << 30  # ... or this where physical memory cannot be read

assert MAX_POOL_PAGES < MAX_OBJECTS and MAX_RETAIN_EVERY_BLOCKS <= MAX_BLOCK_ROWS
