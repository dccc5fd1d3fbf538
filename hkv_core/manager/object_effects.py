"""The manager's implementation of every effect a device object's transition may name.

Each effect is `(pool, objs, actor, counts) -> None` over distinct objects of
one pool, all in the same source state, after the edge's guards passed.  The
model checker implements the same names over its abstract world
(hkv_core/checker/effects.py); a test proves both registries and the spec's
name set agree.  Content effects (append_row, clear_rows, freeze_content)
change nothing here: the bytes live in executors, and an object's
rows are read from its owner's committed watermark (`row_token`,
`full_token`).  Index effects (rows, references) belong to the index tables
(hkv_core/manager/index/entries.py) and are refused on device objects.
`pool` below is the object table of every page pool (`object_table.ObjectTable`: `PagePools`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.object_table import ObjectTable

Index = NDArray[np.intp]
Effect = Callable[[ObjectTable, Index, int, "Index | None"], None]


def _noop(pool: ObjectTable, objs: Index, actor: int, counts: Index | None) -> None:
    return None


def _not_for_objects(name: str) -> Effect:
    def refuse(pool: ObjectTable, objs: Index, actor: int, counts: Index | None) -> None:
        raise AssertionError(f"effect {name} belongs to index entries, not to device objects")
    return refuse


def _take_slot(pool: ObjectTable, objs: Index, actor: int, counts: Index | None) -> None:
    pool.take_slots(objs)


def _free_slot(pool: ObjectTable, objs: Index, actor: int, counts: Index | None) -> None:
    pool.free_placements(objs)


def _set_owner(pool: ObjectTable, objs: Index, actor: int, counts: Index | None) -> None:
    assert actor >= 0, "set_owner needs an acting request"
    pool.owner[objs] = actor


def _clear_owner(pool: ObjectTable, objs: Index, actor: int, counts: Index | None) -> None:
    pool.owner[objs] = -1


def _seal_rows(pool: ObjectTable, objs: Index, actor: int, counts: Index | None) -> None:
    """The object's size becomes what its owner has committed (a partial prefix page kept as it is)."""
    pool.full_token[objs] = pool.requests.committed[pool.owner[objs]]


# Counters move by plain fancy indexing: a step's objects are distinct.
def _add_lease(pool: ObjectTable, objs: Index, actor: int, counts: Index | None) -> None:
    pool.leases[objs] += 1


def _drop_lease(pool: ObjectTable, objs: Index, actor: int, counts: Index | None) -> None:
    pool.leases[objs] -= 1


def _pin_copy(pool: ObjectTable, objs: Index, actor: int, counts: Index | None) -> None:
    pool.copies[objs] += 1


def _unpin_copy(pool: ObjectTable, objs: Index, actor: int, counts: Index | None) -> None:
    pool.copies[objs] -= 1


def _add_holder(pool: ObjectTable, objs: Index, actor: int, counts: Index | None) -> None:
    pool.holders[objs] += 1 if counts is None else counts.astype(np.int32)


def _drop_holder(pool: ObjectTable, objs: Index, actor: int, counts: Index | None) -> None:
    pool.holders[objs] -= 1 if counts is None else counts.astype(np.int32)


def _bump_version(pool: ObjectTable, objs: Index, actor: int, counts: Index | None) -> None:
    pool.bump(objs)


EFFECTS: Mapping[str, Effect] = MappingProxyType({
    "take_slot": _take_slot,
    "free_slot": _free_slot,
    "set_owner": _set_owner,
    "clear_owner": _clear_owner,
    "append_row": _noop,
    "clear_rows": _noop,
    "seal_rows": _seal_rows,
    "freeze_content": _noop,
    "add_lease": _add_lease,
    "drop_lease": _drop_lease,
    "pin_copy": _pin_copy,
    "unpin_copy": _unpin_copy,
    "bump_version": _bump_version,
    "mark_ahead": _noop,  # ahead is data here: row_token past the owner's known tokens (requests.known)
    "add_holder": _add_holder,
    "drop_holder": _drop_holder,
    "take_row": _not_for_objects("take_row"),
    "free_row": _not_for_objects("free_row"),
    "hold_references": _not_for_objects("hold_references"),
    "drop_references": _not_for_objects("drop_references"),
})


def runnable(names: tuple[str, ...]) -> tuple[Effect, ...]:
    """The effects of `names` that change something here (content effects are no-ops: skipped)."""
    return tuple(EFFECTS[name] for name in names if EFFECTS[name] is not _noop)
