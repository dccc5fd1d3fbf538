"""The checker's implementation of every effect named in the spec.

An effect maps `(seg, free_slots, actor)` to a new `(seg, free_slots)`, or to
None when the move leaves the checker's bound (a version past `version_cap`).
The CacheManager applies the same effects to its live records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from hkv_core.checker.world import CheckConfig, Seg

Effect = Callable[[Seg, int, int, CheckConfig], tuple[Seg, int] | None]


def _take_slot(seg: Seg, free: int, actor: int, cfg: CheckConfig) -> tuple[Seg, int] | None:
    assert free != 0, "guard slot_available must precede take_slot"
    slot = (free & -free).bit_length() - 1
    return seg._replace(slot=slot), free & ~(1 << slot)


def _free_slot(seg: Seg, free: int, actor: int, cfg: CheckConfig) -> tuple[Seg, int] | None:
    assert seg.slot >= 0, "free_slot on a segment without a slot"
    return seg._replace(slot=-1), free | (1 << seg.slot)


def _bump_version(seg: Seg, free: int, actor: int, cfg: CheckConfig) -> tuple[Seg, int] | None:
    if seg.version >= cfg.version_cap:
        return None
    return seg._replace(version=seg.version + 1), free


def _lease(add: bool) -> Effect:
    def apply(seg: Seg, free: int, actor: int, cfg: CheckConfig) -> tuple[Seg, int] | None:
        assert actor >= 0, "lease effects need an acting request"
        bit = 1 << actor
        return seg._replace(leases=(seg.leases | bit) if add else (seg.leases & ~bit)), free
    return apply


def _set(**fields: int) -> Effect:
    def apply(seg: Seg, free: int, actor: int, cfg: CheckConfig) -> tuple[Seg, int] | None:
        return seg._replace(**fields), free
    return apply


def _set_owner(seg: Seg, free: int, actor: int, cfg: CheckConfig) -> tuple[Seg, int] | None:
    assert actor >= 0, "set_owner needs an acting request"
    return seg._replace(owner=actor), free


def _append_row(seg: Seg, free: int, actor: int, cfg: CheckConfig) -> tuple[Seg, int] | None:
    return seg._replace(rows=seg.rows + 1), free


def _freeze(seg: Seg, free: int, actor: int, cfg: CheckConfig) -> tuple[Seg, int] | None:
    return seg._replace(frozen=seg.rows), free


EFFECTS: Mapping[str, Effect] = MappingProxyType({
    "take_slot": _take_slot,
    "free_slot": _free_slot,
    "set_owner": _set_owner,
    "clear_owner": _set(owner=-1),
    "append_row": _append_row,
    "clear_rows": _set(rows=0, frozen=-1),
    "freeze_content": _freeze,
    "add_lease": _lease(add=True),
    "drop_lease": _lease(add=False),
    "pin_copy": _set(copy=1),
    "unpin_copy": _set(copy=0),
    "bump_version": _bump_version,
    "quarantine": _set(quarantined=1),
})

ACTOR_GUARDS = frozenset({"is_owner", "leased_by_actor", "not_leased_by_actor"})
ACTOR_EFFECTS = frozenset({"set_owner", "add_lease", "drop_lease"})
