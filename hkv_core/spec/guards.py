"""Named guard predicates.  Pure functions of a GuardView; no side effects.

The model checker and the CacheManager each provide a GuardView over their own
structures, so one spec gates both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from hkv_core.arrays import all_true


class GuardView(Protocol):
    """What a guard may ask about the segment(s) being moved and their surroundings.

    A view over one segment answers with Python scalars; a bulk view over many
    pages answers with NumPy arrays (one element per page).  Guards combine the
    answers with NumPy logical functions so both work.
    """

    def slot_available(self) -> Any: ...
    def is_owner(self) -> Any: ...
    def rows_full(self) -> Any: ...
    def leased_by_actor(self) -> Any: ...
    def lease_count(self) -> Any: ...
    def copy_pinned(self) -> Any: ...
    def targets_filling(self) -> Any: ...
    def loads_in_flight(self) -> Any: ...
    def holders(self) -> Any: ...
    def rows_written(self) -> Any: ...
    def parent_indexed(self) -> Any: ...
    def children(self) -> Any: ...
    def chain_tail(self) -> Any: ...
    def has_point(self) -> Any: ...
    def block_indexed(self) -> Any: ...
    def tokens_known(self) -> Any: ...


Guard = Callable[[GuardView], Any]


def _not(answer: Any) -> Any:
    """Logical not of a scalar or per-page answer (plain `not` for a Python bool: no NumPy call)."""
    return (not answer) if type(answer) is bool else np.logical_not(answer)


_GUARDS: dict[str, Guard] = {
    "slot_available": lambda v: v.slot_available(),
    "is_owner": lambda v: v.is_owner(),
    "rows_full": lambda v: v.rows_full(),
    "rows_not_full": lambda v: _not(v.rows_full()),
    "leased_by_actor": lambda v: v.leased_by_actor(),
    "not_leased_by_actor": lambda v: _not(v.leased_by_actor()),
    "unpinned": lambda v: np.logical_and(np.equal(v.lease_count(), 0), np.logical_not(v.copy_pinned())),
    "targets_filling": lambda v: v.targets_filling(),
    "no_load_in_flight": lambda v: np.equal(v.loads_in_flight(), 0),
    "held": lambda v: np.greater(v.holders(), 0),
    "unheld": lambda v: np.equal(v.holders(), 0),
    "has_rows": lambda v: np.greater(v.rows_written(), 0),
    "parent_indexed": lambda v: v.parent_indexed(),
    "no_children": lambda v: np.equal(v.children(), 0),
    "not_chain_tail": lambda v: _not(v.chain_tail()),
    "no_point": lambda v: _not(v.has_point()),
    "block_indexed": lambda v: v.block_indexed(),
    "tokens_known": lambda v: v.tokens_known(),
}

GUARDS: Mapping[str, Guard] = MappingProxyType(_GUARDS)


def first_refusing(guards: tuple[Guard, ...], names: tuple[str, ...], view: GuardView) -> str | None:
    """The name of the first guard that refuses, or None when all pass (`guards` and `names` pair up)."""
    for guard, name in zip(guards, names, strict=True):
        verdict = guard(view)
        if type(verdict) is np.ndarray:
            if not all_true(verdict):
                return name
        elif not verdict:
            return name
    return None
