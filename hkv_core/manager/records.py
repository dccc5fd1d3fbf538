"""Records the manager hands to engines: hits with verdicts, leases, allocations, copy ops."""

from __future__ import annotations

import attrs
import numpy as np
from numpy.typing import NDArray


@attrs.frozen(kw_only=True)
class Reason:
    """One validation layer's reason for shortening, rejecting, or the rule that applied."""

    layer: str
    code: str
    detail: str


@attrs.frozen(kw_only=True)
class Hit:
    """The longest safe resume point of a request and why it is not longer.

    `pages[pool]` / `versions[pool]` are the pages the hit needs and the
    versions they had when checked; `acquire` refuses the hit if any moved.
    """

    request_id: int
    tokens: int
    candidate_tokens: int
    reasons: tuple[Reason, ...]
    block_ids: NDArray[np.int32]
    pages: dict[str, NDArray[np.int32]]
    versions: dict[str, NDArray[np.uint32]]
    partial_copy: bool

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(r.code for r in self.reasons)


@attrs.frozen(kw_only=True)
class CopyPages:
    """Copy the first `entries` entries of `src` into `dst` in one pool (copy-on-write).

    `src_version` is the version the lease checked; executors refuse the op if it moved.
    """

    pool: str
    src: int
    dst: int
    entries: int
    src_version: int


@attrs.frozen(kw_only=True)
class Allocation:
    """Where the next `num_tokens` tokens of a request go, per pool.

    - `block_tables[pool]`: the request's page per page index (prefix pools)
      or per block (window pools; NULL where a block is outside every window).
    - `slots[pool]`: for each entry the new tokens produce, the flat slot
      `page * entries_per_page + offset` (window: one per token; prefix: one
      per completed compressed entry).
    - `tail_pages[pool]`: the request's working compressor-tail page.
    - `snapshots[P][pool]`: the page to copy the tail rows into at boundary P.
    - `copies`: copy-on-write ops to run before the forward pass.
    """

    request_id: int
    start_tokens: int
    num_tokens: int
    block_tables: dict[str, NDArray[np.int32]]
    slots: dict[str, NDArray[np.int64]]
    tail_pages: dict[str, int]
    snapshots: dict[int, dict[str, int]]
    copies: tuple[CopyPages, ...]
