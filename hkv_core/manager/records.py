"""Records the manager hands to engines: hits with verdicts and allocations with their plan.

Both are frozen, their mappings are read-only views and their arrays are
read-only: a Hit is evidence of what match saw (acquire re-derives its pages
from the index and refuses one that differs), an Allocation is where the
engine writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.plan import CopyPages, Plan


def frozen_array(array: NDArray[Any]) -> NDArray[Any]:
    """`array` itself, made read-only (the caller hands over a fresh array)."""
    array.setflags(write=False)
    return array


def _frozen_dict(value: Mapping[str, NDArray[Any]]) -> Mapping[str, NDArray[Any]]:
    """A read-only mapping of read-only arrays (the caller hands over fresh arrays)."""
    for array in value.values():  # (member pools of one page pool share an array: freezing twice is harmless)
        array.setflags(write=False)
    return value if isinstance(value, MappingProxyType) else MappingProxyType(dict(value))


@attrs.frozen(kw_only=True)
class Reason:
    """One validation layer's reason for shortening, rejecting, or the rule that applied."""

    layer: str
    code: str
    detail: str


@attrs.frozen(kw_only=True)
class Hit:
    """The longest safe resume point of a request and why it is not longer.

    `pages[pool]` / `versions[pool]` are the pages the hit reads and the
    versions they had when checked; `block_ids` / `block_versions` the blocks
    of the prefix; `point` / `point_version` the resume point it resumes at
    (-1 when the layout needs none or the hit is empty).  `acquire` refuses
    the hit if any of them moved, or if its pages are not what the index
    says the point reads.
    """

    request_id: int
    tokens: int
    candidate_tokens: int
    reasons: tuple[Reason, ...]
    block_ids: NDArray[np.int32] = attrs.field(converter=frozen_array)
    block_versions: NDArray[np.uint32] = attrs.field(converter=frozen_array)
    pages: Mapping[str, NDArray[np.int32]] = attrs.field(converter=_frozen_dict)
    versions: Mapping[str, NDArray[np.int64]] = attrs.field(converter=_frozen_dict)
    partial_copy: bool
    point: int = -1
    point_version: int = 0

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(r.code for r in self.reasons)


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
    - `draft_tails[E][pool]` (speculative steps only, `CacheManager.propose`):
      the page that must hold the compressor tail at E, rows
      [0, tail_rows(E)), for every end E the step may be accepted at; the
      working tail (`tail_pages`) is read at `start_tokens`, never written.
      `draft_tokens`: how many of the `num_tokens` are unverified drafts (the
      last ones).
    - `plan`: the copies to run before the forward pass (copy-on-write of a
      partial prefix page, seeding the working tail from the hit's
      snapshot), issued with a plan id; None when there is nothing to copy.
      Run it, then hand the completion to `CacheManager.complete`.

    `block_tables` arrays are read-only *views* of the request's live page
    table (handing them out costs O(new pages), not O(context)): a later
    `commit` (a window slid, a page released) or `allocate` shows through.
    Copy them (`np.array(a)`) to keep this moment's table.
    """

    request_id: int
    start_tokens: int
    num_tokens: int
    block_tables: Mapping[str, NDArray[np.int32]] = attrs.field(converter=_frozen_dict)
    slots: Mapping[str, NDArray[np.int64]] = attrs.field(converter=_frozen_dict)
    tail_pages: dict[str, int]
    snapshots: dict[int, dict[str, int]]
    plan: Plan | None = None
    draft_tails: dict[int, dict[str, int]] = attrs.field(factory=dict)
    draft_tokens: int = 0

    @property
    def copies(self) -> tuple[CopyPages, ...]:
        """The plan's copy ops (empty without a plan)."""
        return tuple(op for op in self.plan.ops if isinstance(op, CopyPages)) if self.plan else ()
