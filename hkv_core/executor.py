"""The narrow executor interface (DESIGN.md section 4).

An executor owns the bytes; the manager owns the metadata.  An executor
implements four methods:

- `bind(pools, versions) -> addresses`: allocate every pool once (static
  pools: base addresses never change, so captured CUDA Graphs stay valid,
  FAILURES.md F9) and keep `versions`, the manager's page-version lookup.
- `run(plan) -> Completion`: verify every op's lease versions first
  (`check_versions`: StaleLease and nothing run if any moved), then carry
  the ops out in order.
- `read(pool, pages)`: copies of whole pages, shape
  `(n, layers, entries_per_page, *entry_shape)`.
- `write(pool, slots, values)`: one entry per flat slot
  `page * entries_per_page + offset`, values shaped `(n, layers, *entry_shape)`.

A pool's array has shape `PoolBinding.shape`:
`(pages, layers, entries_per_page, *entry_shape)`, page 0 being the NULL page
(never written by `write`, copies or loads).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs
import numpy as np
from numpy.typing import ArrayLike, NDArray

from hkv_core.layout import PoolSpec
from hkv_core.manager import CacheManager, StaleLease
from hkv_core.plan import Completion, Plan, version_checks

VersionsFn = Callable[[str, NDArray[np.int32]], NDArray[np.uint32]]


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


class Executor(Protocol):
    """What the manager and an engine need from a backend (NumPy, CUDA)."""

    def bind(self, pools: Sequence[PoolBinding], versions: VersionsFn) -> dict[str, int]:
        """Allocate every pool once; return each pool's base address (stable for the executor's life)."""
        ...

    def run(self, plan: Plan) -> Completion:
        """Verify every op's versions (StaleLease, nothing run), then run the ops in order."""
        ...

    def read(self, pool: str, pages: ArrayLike) -> NDArray[Any]:
        """Copies of whole pages: (n, layers, entries_per_page, *entry_shape)."""
        ...

    def write(self, pool: str, slots: ArrayLike, values: ArrayLike) -> None:
        """Write one entry (every layer) per flat slot; values (n, layers, *entry_shape)."""
        ...


def bindings_for(manager: CacheManager) -> tuple[PoolBinding, ...]:
    """The pools of a manager, sized as its static page pools (NULL page included)."""
    return tuple(PoolBinding(spec=info.spec, pages=info.pages) for info in manager.core.infos)


def versions_for(manager: CacheManager) -> VersionsFn:
    """The manager's live page versions of a pool, looked up at each call."""
    core = manager.core

    def versions(pool: str, pages: NDArray[np.int32]) -> NDArray[np.uint32]:
        found: NDArray[np.uint32] = core.pools[core.pool_index[pool]].version[pages].copy()
        return found

    return versions


def check_versions(plan: Plan, versions: VersionsFn) -> None:
    """StaleLease for the first op of `plan` whose checked page version moved."""
    for op in plan.ops:
        for check in version_checks(op):
            found = int(versions(check.pool, np.array([check.page], np.int32))[0])
            if found != check.version:
                raise StaleLease(pool=check.pool, page=check.page, expected_version=check.version,
                                 found_version=found, request_id=plan.request_id)
