"""Named guard predicates.  Pure functions of a GuardView; no side effects.

The model checker and the CacheManager each provide a GuardView over their own
structures, so one spec gates both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Protocol


class GuardView(Protocol):
    """What a guard may ask about the segment being moved and its surroundings."""

    def slot_available(self) -> bool: ...
    def is_owner(self) -> bool: ...
    def rows_full(self) -> bool: ...
    def leased_by_actor(self) -> bool: ...
    def lease_count(self) -> int: ...
    def copy_pinned(self) -> bool: ...
    def disk_record_durable(self) -> bool: ...
    def source_set_complete(self) -> bool: ...
    def disk_dependents(self) -> int: ...


Guard = Callable[[GuardView], bool]

_GUARDS: dict[str, Guard] = {
    "slot_available": lambda v: v.slot_available(),
    "is_owner": lambda v: v.is_owner(),
    "rows_full": lambda v: v.rows_full(),
    "rows_not_full": lambda v: not v.rows_full(),
    "leased_by_actor": lambda v: v.leased_by_actor(),
    "not_leased_by_actor": lambda v: not v.leased_by_actor(),
    "unpinned": lambda v: v.lease_count() == 0 and not v.copy_pinned(),
    "disk_record_durable": lambda v: v.disk_record_durable(),
    "source_set_complete": lambda v: v.source_set_complete(),
    "no_disk_dependents": lambda v: v.disk_dependents() == 0,
}

GUARDS: Mapping[str, Guard] = MappingProxyType(_GUARDS)


def first_refusing(guards: tuple[Guard, ...], names: tuple[str, ...], view: GuardView) -> str | None:
    """The name of the first guard that refuses, or None when all pass."""
    assert len(guards) == len(names), "guards and names must pair up"
    for guard, name in zip(guards, names, strict=True):
        if not guard(view):
            return name
    return None
