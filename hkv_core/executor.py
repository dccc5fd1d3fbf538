"""The narrow executor interface (docs/executor.md).

An executor owns the bytes; the manager owns the metadata.  The two meet
only through plans (hkv_core.plan) and this protocol, which sits beside the
manager: it depends on layout, plan and errors, never on the manager.

- `bind(pools, authority) -> addresses`: allocate every pool once (static
  pools: base addresses never change, so captured CUDA Graphs stay valid, F9)
  and keep `authority`, whatever issued the plans (the CacheManager).
- `run(plan) -> Completion`: at launch, `authority.verify(plan)` checks every
  op's page versions against the authority's live state under its lock
  (StaleLease and nothing run if any moved); then carry the ops out (later,
  on a stream or a disk worker, is fine: the manager keeps the pages of an
  issued plan pinned until `complete`).  The caller hands the completion back
  with `CacheManager.complete(plan.plan_id, completion)`.
- `read(pool, pages)`: host copies of whole pages, shape
  `(n, layers, entries_per_page, *entry_shape)`.
- `entries(pool, slots, layer)`: copies of the entries at flat slots of one layer,
  `(n, *entry_shape)`, as arrays of the executor's array module `xp` (NumPy for the
  reference, CuPy on a GPU): how a model reads its resume state without leaving the device.
- `write(pool, slots, values)`: one entry per flat slot
  `page * entries_per_page + offset`, values shaped `(n, layers, *entry_shape)`
  (host arrays, or arrays of `xp`).
- `export_rows(pool, runs, out)` / `import_rows(pool, runs, src)`: the tiers'
  offload and reload: runs `(page, first, stop)` of entries, copied in order
  to or from a host array shaped `(layers, n, *entry_shape)` (n the runs'
  total), one strided copy per run (docs/tiers.md).

A pool's array has shape `PoolBinding.shape`:
`(pages, layers, entries_per_page, *entry_shape)`, page 0 being the NULL page
(never written by `write`, copies or loads).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import attrs
from numpy.typing import ArrayLike, NDArray

from hkv_core.errors import InvalidArgument, UnknownPool
from hkv_core.layout import PoolSpec
from hkv_core.plan import Completion, CopyPages, FillPages, LoadRecord, Op, Plan, StoreRecord
from hkv_core.units import NULL_PAGE

__all__ = ["Executor", "PlanAuthority", "PoolBinding", "Run", "TrustingAuthority", "check_op"]

Run = tuple[int, int, int]  # (page, first entry, stop entry): one contiguous piece of a page


@attrs.frozen(kw_only=True)
class PoolBinding:
    """One pool to allocate: its spec and page count (the NULL page included)."""

    spec: PoolSpec
    pages: int

    def __attrs_post_init__(self) -> None:
        assert self.pages >= 2, f"{self.spec.name}: the NULL page and at least one real page"

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def shape(self) -> tuple[int, ...]:
        """(pages, layers, entries_per_page, *entry_shape)."""
        s = self.spec
        return (self.pages, s.layer_count, s.entries_per_page, *s.entry_shape)


class PlanAuthority(Protocol):
    """Whoever issued a plan (the CacheManager): checks its versions at launch, under its own lock."""

    def verify(self, plan: Plan) -> None:
        """StaleLease for the first page of `plan` whose version or state moved since it was planned."""
        ...


class TrustingAuthority:
    """An authority for plans with nothing to check against (standalone executor tests): verifies nothing."""

    def verify(self, plan: Plan) -> None:
        return None


class Executor(Protocol):
    """What the manager and an engine need from a backend (NumPy, CUDA)."""

    def bind(self, pools: Sequence[PoolBinding], authority: PlanAuthority) -> dict[str, int]:
        """Allocate every pool once; return each pool's base address (stable for the executor's life)."""
        ...

    def run(self, plan: Plan) -> Completion:
        """Verify the plan through the authority (StaleLease, nothing run), then run the ops in order."""
        ...

    xp: Any  # the array module of the pools and of what `entries` returns (numpy, cupy)

    def read(self, pool: str, pages: ArrayLike) -> NDArray[Any]:
        """Host copies of whole pages: (n, layers, entries_per_page, *entry_shape)."""
        ...

    def entries(self, pool: str, slots: ArrayLike, layer: int) -> Any:
        """Copies of the entries at flat slots `page * entries_per_page + offset` of one layer: (n, *entry_shape),
        an array of `xp`."""
        ...

    def write(self, pool: str, slots: ArrayLike, values: ArrayLike) -> None:
        """Write one entry (every layer) per flat slot; values (n, layers, *entry_shape)."""
        ...

    def export_rows(self, pool: str, runs: Sequence[Run], out: NDArray[Any]) -> None:
        """Copy entries [first, stop) of each run's page, in order, into `out` (layers, n, *entry_shape)."""
        ...

    def import_rows(self, pool: str, runs: Sequence[Run], src: NDArray[Any]) -> None:
        """Copy `src` (layers, n, *entry_shape), in order, into entries [first, stop) of each run's page (never
        the NULL page)."""
        ...


def check_op(op: Op, shapes: dict[str, tuple[int, ...]], records: dict[str, tuple[str, int]]) -> None:
    """Check that `op` is well formed for pools of `shapes`; `records` are the host records as they will be when it
    runs (a StoreRecord adds its record).  Every executor checks a whole plan this way before running any of it:
    UnknownPool for a pool it does not have, InvalidArgument (argument `plan`) for a page outside the pool, a copy
    into the NULL page or onto its source, an entry count outside the page, a load of a record it does not hold."""
    if op.pool not in shapes:
        raise UnknownPool(pool=op.pool, known=tuple(shapes), action="run")
    pages, entries = shapes[op.pool][0], shapes[op.pool][2]
    touched = (op.src, op.dst) if isinstance(op, CopyPages) else op.pages
    reason = ""
    if not all(0 <= p < pages for p in touched):
        reason = f"a page outside [0, {pages})"
    elif isinstance(op, CopyPages) and (op.dst == NULL_PAGE or op.src == op.dst):
        reason = "a copy into the NULL page or onto its own source"
    elif isinstance(op, CopyPages) and not 0 <= op.entries <= entries:
        reason = f"an entry count outside [0, {entries}]"
    elif isinstance(op, LoadRecord) and NULL_PAGE in op.pages:
        reason = "a load into the NULL page"
    elif isinstance(op, FillPages) and not 0 <= op.value <= 255:
        reason = f"a fill byte {op.value} outside 0..255"
    elif isinstance(op, LoadRecord) and records.get(op.record) != (op.pool, len(op.pages)):
        reason = f"no record {op.record!r} of {len(op.pages)} {op.pool} pages"
    if reason:
        raise InvalidArgument(action="run", argument="plan", value=op, reason=f"{op.pool}: {reason}")
    if isinstance(op, StoreRecord):
        records[op.record] = (op.pool, len(op.pages))
