"""Manager configuration: pool sizes, admission caps, retention policy, validation options."""

from __future__ import annotations

import attrs

from hkv_core.errors import ConfigError

DEFAULT_POOL_PAGES = 4096
DEFAULT_MAX_REQUESTS = 256
DEFAULT_RETAIN_EVERY_BLOCKS = 16


@attrs.frozen(kw_only=True)
class ManagerConfig:
    """Everything a CacheManager is built with besides the layout.

    - `pool_pages`: real pages per pool (the NULL page comes on top), by pool
      name; pools not named get `default_pool_pages`.  Pools are static.
    - `max_requests`: admission cap on requests in flight.
    - `retain_every_blocks`: a resume point (window + tail snapshots) is kept
      at every block boundary that is a multiple of this, plus at the end of
      each prompt (`retain_prompt_end`).
    - `allow_partial_page_copy`: resume at any block boundary by copying the
      partial prefix page (copy-on-write); False restricts hits to multiples
      of the LCM of all prefix pools' tokens per page.
    - `accepted_abi`: abi ids the executor's kernels accept (None: all).
    - `device_alignment_bytes`: device page alignment (None: the layout's).
    - `seed`: block-key seed (None: a secret random one per manager).
    """

    pool_pages: dict[str, int] = attrs.field(factory=dict)
    default_pool_pages: int = DEFAULT_POOL_PAGES
    max_requests: int = DEFAULT_MAX_REQUESTS
    retain_every_blocks: int = DEFAULT_RETAIN_EVERY_BLOCKS
    retain_prompt_end: bool = True
    allow_partial_page_copy: bool = True
    accepted_abi: frozenset[str] | None = None
    device_alignment_bytes: int | None = None
    seed: int | None = None
    debug_checks: bool = False

    def __attrs_post_init__(self) -> None:
        for key, value in [("default_pool_pages", self.default_pool_pages),
                           ("max_requests", self.max_requests),
                           ("retain_every_blocks", self.retain_every_blocks),
                           *[(f"pool_pages[{k}]", v) for k, v in self.pool_pages.items()]]:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"expected an integer >= 1, got {value!r}", source="ManagerConfig", key=key)
        alignment = self.device_alignment_bytes
        if alignment is not None and (alignment < 1 or alignment & (alignment - 1)):
            raise ConfigError(f"expected a power of two, got {alignment!r}", source="ManagerConfig",
                              key="device_alignment_bytes")
