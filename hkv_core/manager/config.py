"""Manager configuration: pool sizes, admission caps, retention policy, validation options."""

from __future__ import annotations

import attrs

from hkv_core.errors import ConfigError

DEFAULT_POOL_PAGES = 4096
DEFAULT_MAX_REQUESTS = 256
DEFAULT_RETAIN_EVERY_BLOCKS = 16
DEFAULT_MAX_REQUEST_TOKENS = 1 << 21  # 2,097,152 tokens: a two-million-token context
DEFAULT_MAX_PENDING_EVENTS = 4096  # batches of cache events kept for take_events (older ones: counted, dropped)
DEFAULT_EVICT_SLACK_SHIFT = 6  # an eviction frees 1/64 of a pool beyond what the allocation needs


@attrs.frozen(kw_only=True)
class ManagerConfig:
    """Everything a CacheManager is built with besides the layout.

    - `pool_pages`: real pages per pool (the NULL page comes on top), by pool
      name; pools not named get `default_pool_pages`.  Pools are static.
    - `max_requests`: admission cap on requests in flight.
    - `max_request_tokens`: admission cap on one request's tokens (prompt and
      decoded); bounds every per-request table.
    - `max_blocks` / `max_points`: rows of the prefix index's block table and
      resume-point table (None: derived from the pool sizes, docs/limits.md).
    - `retain_every_blocks`: a resume point (window + tail snapshots) is kept
      at every block boundary that is a multiple of this, plus at the end of
      each prompt (`retain_prompt_end`); only boundaries a hit can use.
    - `allow_partial_page_copy`: resume at any block boundary by copying the
      partial prefix page (copy-on-write); False restricts hits to multiples
      of the LCM of all prefix pools' tokens per page.
    - `evict_slack_shift`: an eviction that must free pages frees another
      `pages >> shift` beyond the need (a low-water mark: eviction runs on a
      few percent of allocations, in bulk); None evicts exactly the need.
    - `accepted_abi`: abi ids the executor's kernels accept (None: all).
    - `device_alignment_bytes`: device page alignment (None: the layout's).
    - `seed`: block-key seed (None: a secret random one per manager).
    - `debug_checks`: run `check_invariants` after every call.
    - `kv_events`: record KV cache events for `take_events` (routers); off: none
      recorded, nothing spent.  `max_pending_events`: batches kept between two
      `take_events` calls (older ones are dropped and counted: `EventsLost`).
    """

    pool_pages: dict[str, int] = attrs.field(factory=dict)
    default_pool_pages: int = DEFAULT_POOL_PAGES
    max_requests: int = DEFAULT_MAX_REQUESTS
    max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS
    max_blocks: int | None = None
    max_points: int | None = None
    retain_every_blocks: int = DEFAULT_RETAIN_EVERY_BLOCKS
    retain_prompt_end: bool = True
    allow_partial_page_copy: bool = True
    evict_slack_shift: int | None = DEFAULT_EVICT_SLACK_SHIFT
    accepted_abi: frozenset[str] | None = None
    device_alignment_bytes: int | None = None
    seed: int | None = None
    debug_checks: bool = False
    kv_events: bool = False
    max_pending_events: int = DEFAULT_MAX_PENDING_EVENTS

    def __attrs_post_init__(self) -> None:
        counts = [("default_pool_pages", self.default_pool_pages), ("max_requests", self.max_requests),
                  ("max_request_tokens", self.max_request_tokens), ("retain_every_blocks", self.retain_every_blocks),
                  ("max_pending_events", self.max_pending_events),
                  *[(f"pool_pages[{k}]", v) for k, v in self.pool_pages.items()],
                  *[(k, v) for k, v in (("max_blocks", self.max_blocks), ("max_points", self.max_points))
                    if v is not None]]
        for key, value in counts:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"expected an integer >= 1, got {value!r}", source="ManagerConfig", key=key)
        shift = self.evict_slack_shift
        if shift is not None and (not isinstance(shift, int) or isinstance(shift, bool) or not 0 <= shift < 63):
            raise ConfigError(f"expected None or an integer in [0, 63), got {shift!r}", source="ManagerConfig",
                              key="evict_slack_shift")
        alignment = self.device_alignment_bytes
        if alignment is not None and (alignment < 1 or alignment & (alignment - 1)):
            raise ConfigError(f"expected a power of two, got {alignment!r}", source="ManagerConfig",
                              key="device_alignment_bytes")

    def pages_of(self, pool: str) -> int:
        """Real pages of the pool called `pool` (the NULL page not counted)."""
        return self.pool_pages.get(pool, self.default_pool_pages)
