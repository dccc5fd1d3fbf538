"""What the effects and guards of device objects read and write: the page pools' object table, as a Protocol.

`object_effects.py` (the effects) and `object_view.py` (the guards' view)
depend on this shape, not on `page_pools.py`, which implements it and
imports them: the imports run one way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.requests import RequestTable

Index = NDArray[np.intp]


class FreePages(Protocol):
    """One page pool's free-page count (what guard `slot_available` reads)."""

    @property
    def free_slot_count(self) -> int: ...


class FreeSpace(Protocol):
    """A block space several pools draw from: its free-page count."""

    count: int


class ObjectTable(Protocol):
    """Per object (ids index every array): its pool, owner, pins, references, row watermarks, tier loads in flight;
    the page pools (their free pages) and the request table (watermarks, pin lists)."""

    @property
    def pool(self) -> NDArray[Any]: ...

    @property
    def pools(self) -> Sequence[FreePages]: ...

    @property
    def runs(self) -> tuple[Index, Sequence[tuple[FreePages, Index]]] | None: ...

    @property
    def spaces(self) -> Sequence[FreeSpace]: ...

    @property
    def owner(self) -> NDArray[np.int32]: ...

    @property
    def leases(self) -> NDArray[np.int32]: ...

    @property
    def copies(self) -> NDArray[np.int32]: ...

    @property
    def holders(self) -> NDArray[np.int32]: ...

    @property
    def row_token(self) -> NDArray[np.int64]: ...

    @property
    def full_token(self) -> NDArray[np.int64]: ...

    @property
    def loads(self) -> NDArray[np.int32]: ...

    @property
    def requests(self) -> RequestTable: ...

    def take_slots(self, objs: Index) -> None: ...

    def free_placements(self, objs: Index) -> None: ...

    def bump(self, objs: Index) -> None: ...

    def lease_mark(self, pinned: NDArray[np.integer[Any]], objs: NDArray[np.integer[Any]]) -> NDArray[np.bool_]: ...
