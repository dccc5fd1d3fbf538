"""Manager configuration: pool sizes, admission caps, retention policy, validation options."""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs

from hkv_core.block_keys import ALGORITHMS, SEED_LIMIT
from hkv_core.errors import ConfigError, shown
from hkv_core.manager.config_bounds import (
    MAX_BLOCK_ROWS,
    MAX_DEVICE_ALIGNMENT_BYTES,
    MAX_PENDING_EVENTS,
    MAX_POINT_ROWS,
    MAX_POOL_PAGES,
    MAX_REQUEST_TOKENS,
    MAX_REQUESTS,
    MAX_RETAIN_EVERY_BLOCKS,
    METADATA_FALLBACK_BYTES,
    METADATA_MEMORY_SHARE,
)

EVICTIONS = ("lru", "adaptive")  # ManagerConfig.eviction's choices (hkv_core/manager/index/eviction.py)

DEFAULT_POOL_PAGES = 4096
DEFAULT_MAX_REQUESTS = 256
DEFAULT_RETAIN_EVERY_BLOCKS = 16
DEFAULT_MAX_REQUEST_TOKENS = 1 << 21  # 2,097,152 tokens: a two-million-token context
DEFAULT_MAX_PENDING_EVENTS = 4096  # records of cache events kept for take_events (older ones: counted, dropped)
DEFAULT_EVICT_SLACK_SHIFT = 6  # an eviction frees 1/64 of a pool beyond what the allocation needs
DEFAULT_BLOCK_HASH = "xxh3_128"
UPPER_BOUNDS = {"default_pool_pages": MAX_POOL_PAGES, "pool_pages": MAX_POOL_PAGES, "shared_pages": MAX_POOL_PAGES,
                "max_requests": MAX_REQUESTS,
                "max_request_tokens": MAX_REQUEST_TOKENS, "retain_every_blocks": MAX_RETAIN_EVERY_BLOCKS,
                "max_blocks": MAX_BLOCK_ROWS, "max_points": MAX_POINT_ROWS,
                "max_pending_events": MAX_PENDING_EVENTS}  # every size: docs/limits.md


def _hidden(seed: int | None) -> str:
    """How repr shows the key seed: whether one is set, never its value."""
    return "None" if seed is None else "<secret>"


def default_metadata_limit() -> int:
    """The default `max_metadata_bytes`: half of physical memory (METADATA_FALLBACK_BYTES where unknown)."""
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return METADATA_FALLBACK_BYTES
    return physical // METADATA_MEMORY_SHARE if physical > 0 else METADATA_FALLBACK_BYTES


def _int_in(value: object, low: int, high: int | None = None) -> bool:
    """Whether `value` is an int (a bool is not) in [low, high] (no upper bound when `high` is None)."""
    return (isinstance(value, int) and not isinstance(value, bool) and value >= low
            and (high is None or value <= high))


def _abi_ids(value: frozenset[str] | set[str] | tuple[str, ...] | list[str] | None) -> frozenset[str] | None:
    """`accepted_abi` as a frozenset of abi ids (None: all), else ConfigError."""
    if value is None:
        return None
    if not isinstance(value, frozenset | set | tuple | list):
        raise ConfigError(f"expected None or a set of abi id strings, got {type(value).__name__}",
                          source="ManagerConfig", key="accepted_abi")
    if not all(isinstance(v, str) for v in value):
        raise ConfigError(f"expected None or a set of abi id strings, got {shown(value)}", source="ManagerConfig",
                          key="accepted_abi")
    return frozenset(value)


@attrs.frozen(kw_only=True)
class ManagerConfig:
    """Everything a CacheManager is built with besides the layout.

    - `pool_pages`: real pages per pool (the NULL page comes on top), a
      mapping of pool name to count; pools not named get
      `default_pool_pages`.  Pools are static.
    - `shared_pages`: one block space of that many real pages (the NULL page
      on top) from which every pool draws its pages when it needs them, as
      an engine's cache groups draw blocks from one pool (vLLM): a page id
      is a block of the space, held by one pool at a time, and eviction
      frees blocks for whichever pool needs them.  Each layout pool is then
      its own page pool (a block is one pool's page), and `pool_pages` caps
      a pool's pages (its admission cap; pools not named may take the whole
      space), never splits the space.  None (the default): static pools.
    - `max_requests`: admission cap on requests in flight.
    - `max_request_tokens`: admission cap on one request's tokens (prompt and
      decoded); bounds every per-request table.
    - `max_blocks` / `max_points`: rows of the prefix index's block table and
      resume-point table (None: derived from the pool sizes, docs/limits.md).
    - `retain_every_blocks`: a resume point (window + tail snapshots) is kept
      at every block boundary that is a multiple of this, plus at the end of
      each prompt (`retain_prompt_end`) and at its junction with the longest
      cached chain (`retain_junction`); only boundaries a hit can use.
    - `allow_partial_page_copy`: resume at any block boundary by copying the
      partial prefix page (copy-on-write); False restricts hits to multiples
      of the LCM of all prefix pools' tokens per page.
    - `evict_slack_shift`: an eviction that must free pages frees another
      `pages >> shift` beyond the need (a low-water mark: eviction runs on a
      few percent of allocations, in bulk); None evicts exactly the need.
    - `accepted_abi`: abi ids the executor's kernels accept (None: all); a
      frozenset, set, tuple or list of strings, kept as a frozenset (a bare
      string, which would match by substring, is refused).
    - `device_alignment_bytes`: device page alignment (None: the layout's).
    - `key_seed`: the block-key seed, an integer in [0, 2**64) (None, the
      default: a secret random one per manager).  Keys of two managers are
      comparable only when they share a seed (and `block_hash` and block
      size): a cache-aware router that compares keys across instances needs
      one.  The trade-off: whoever knows the seed can compute the key of any
      prompt, so can precompute keys and collisions for a chosen prompt and,
      through hits, timing or cache events, probe what another tenant cached;
      a shared seed must be kept as secret as the prompts (per-tenant salts
      still separate tenants).  repr never prints it.
    - `block_hash`: the block-key hash, "xxh3_128" (default) or "sha256"
      (hkv_core.block_keys).
    - `eviction`: the prefix cache's eviction policy, "lru" (default) or
      "adaptive" (admission by learned reuse, recency with a use-rate bonus;
      docs/replay.md); both evict children before parents.
    - `max_metadata_bytes`: the most host memory the manager's tables may
      take (`estimate_metadata`); None: half of physical memory.  A config
      that needs more is refused with MetadataTooLarge before anything is
      allocated.
    - `debug_checks`: run `check_invariants` after every call.
    - `kv_events`: record KV cache events for `take_events` (routers); off: none
      recorded, nothing spent.  `max_pending_events`: records kept between two
      `take_events` calls (older ones are dropped and counted: `EventsLost`).
    - `mtp_window`: also manage the MTP (draft) layers' pools (`Layout.mtp_pools`,
      DeepSeek-V4: their sliding window), for speculative decoding: their
      window pages join the window page pools, every resume point holds them,
      so a hit includes them.  Off (the default): the main layers' pools only.
    """

    pool_pages: dict[str, int] = attrs.field(factory=dict)
    default_pool_pages: int = DEFAULT_POOL_PAGES
    shared_pages: int | None = None
    max_requests: int = DEFAULT_MAX_REQUESTS
    max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS
    max_blocks: int | None = None
    max_points: int | None = None
    retain_every_blocks: int = DEFAULT_RETAIN_EVERY_BLOCKS
    retain_prompt_end: bool = True
    retain_junction: bool = True
    allow_partial_page_copy: bool = True
    evict_slack_shift: int | None = DEFAULT_EVICT_SLACK_SHIFT
    accepted_abi: frozenset[str] | None = attrs.field(default=None, converter=_abi_ids)
    device_alignment_bytes: int | None = None
    key_seed: int | None = attrs.field(default=None, repr=_hidden)
    block_hash: str = DEFAULT_BLOCK_HASH
    eviction: str = "lru"
    max_metadata_bytes: int | None = None
    debug_checks: bool = False
    kv_events: bool = False
    max_pending_events: int = DEFAULT_MAX_PENDING_EVENTS
    mtp_window: bool = False

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.pool_pages, Mapping):
            raise ConfigError(f"expected a mapping of pool name to page count, got {type(self.pool_pages).__name__}",
                              source="ManagerConfig", key="pool_pages")
        for name in self.pool_pages:
            if not isinstance(name, str):
                raise ConfigError(f"expected pool names (strings) as keys, got {name!r}", source="ManagerConfig",
                                  key="pool_pages")
        counts = [("default_pool_pages", self.default_pool_pages), ("max_requests", self.max_requests),
                  ("max_request_tokens", self.max_request_tokens), ("retain_every_blocks", self.retain_every_blocks),
                  ("max_pending_events", self.max_pending_events),
                  *[(f"pool_pages[{k}]", v) for k, v in self.pool_pages.items()],
                  *[(k, v) for k, v in (("max_blocks", self.max_blocks), ("max_points", self.max_points),
                                        ("shared_pages", self.shared_pages)) if v is not None]]
        for key, value in counts:
            upper = UPPER_BOUNDS[key.split("[")[0]]  # every count has one
            if not _int_in(value, 1, upper):
                raise ConfigError(f"expected an integer in [1, {upper:,}], got {value!r}", source="ManagerConfig",
                                  key=key)
        over = {k: v for k, v in self.pool_pages.items() if self.shared_pages is not None and v > self.shared_pages}
        if over:
            raise ConfigError(f"a pool's cap of {min(over.values()):,} pages is more than the {self.shared_pages:,} "
                              f"pages of the shared space ({', '.join(sorted(over))})", source="ManagerConfig",
                              key="pool_pages")
        shift = self.evict_slack_shift
        if shift is not None and not _int_in(shift, 0, 62):
            raise ConfigError(f"expected None or an integer in [0, 63), got {shift!r}", source="ManagerConfig",
                              key="evict_slack_shift")
        alignment = self.device_alignment_bytes
        if alignment is not None and (not _int_in(alignment, 1, MAX_DEVICE_ALIGNMENT_BYTES)
                                      or alignment & (alignment - 1)):
            raise ConfigError(f"expected None or a power of two in [1, {MAX_DEVICE_ALIGNMENT_BYTES:,}], got "
                              f"{alignment!r}", source="ManagerConfig", key="device_alignment_bytes")
        self._check_keys()
        for flag in ("retain_prompt_end", "retain_junction", "allow_partial_page_copy", "debug_checks", "kv_events",
                     "mtp_window"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"expected True or False, got {getattr(self, flag)!r}", source="ManagerConfig",
                                  key=flag)

    def _check_keys(self) -> None:
        seed = self.key_seed
        if seed is not None and not _int_in(seed, 0, SEED_LIMIT - 1):
            got = type(seed).__name__ if not isinstance(seed, int) else "an integer out of range"  # never the value
            raise ConfigError(f"expected None or an integer in [0, 2**64), got {got}", source="ManagerConfig",
                              key="key_seed")
        if self.eviction not in EVICTIONS:
            raise ConfigError(f"unknown eviction policy {self.eviction!r}; the choices: {', '.join(EVICTIONS)}",
                              source="ManagerConfig", key="eviction")
        if self.block_hash not in ALGORITHMS:
            raise ConfigError(f"unknown block hash {self.block_hash!r}; the choices: {', '.join(ALGORITHMS)}",
                              source="ManagerConfig", key="block_hash")
        limit = self.max_metadata_bytes
        if limit is not None and not _int_in(limit, 1):
            raise ConfigError(f"expected None or an integer >= 1, got {limit!r}", source="ManagerConfig",
                              key="max_metadata_bytes")

    def metadata_limit(self) -> int:
        """`max_metadata_bytes`, or the default (half of physical memory)."""
        return self.max_metadata_bytes if self.max_metadata_bytes is not None else default_metadata_limit()

    def pages_of(self, pool: str) -> int:
        """Real pages of the pool called `pool` (the NULL page not counted): with a shared space, its cap."""
        return self.pool_pages.get(pool, self.default_pool_pages if self.shared_pages is None else self.shared_pages)

    def slots_of(self, pool: str) -> int:
        """Page ids of the pool called `pool` (the NULL page not counted): the shared space's, or its own."""
        return self.pages_of(pool) if self.shared_pages is None else self.shared_pages
