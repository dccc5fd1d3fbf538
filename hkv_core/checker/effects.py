"""The checker's implementation of every effect named in the spec, and how an edge is fired.

An effect edits segment `s` of a `Move` (the scratch copy of the world one
transition changes) for `actor` (-1: nobody) and returns False when the move
must be refused: it leaves the checker's bound (a version past `version_cap`),
or a reference event it fires is refused.  Most effects touch only `s`;
`hold_references` / `drop_references` fire the reference events (`hold`,
`unhold`) through the compiled table on the segments the index entry refers
to (the kinds the spec's [references] lists for its kind, of its prefix), so
the device kinds' own guards and effects (`add_holder`, `drop_holder`) apply.

Index rows (`take_row` / `free_row`) come from an unbounded table: the
checker tracks only whether an entry holds one (`Seg.row`), so `no_slot_leak`
can check that an entry holds a row exactly while its state says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from hkv_core.checker.view import WorldView
from hkv_core.checker.world import Move, Topology
from hkv_core.spec.table import Compiled

Effect = Callable[[Topology, Move, int, int], bool]


def passes(edge: Compiled, view: WorldView) -> bool:
    """Do all of the edge's guards accept the move."""
    return all(bool(guard(view)) for guard in edge.guards)


def apply(topo: Topology, move: Move, s: int, edge: Compiled, actor: int) -> bool:
    """Apply the edge's effects to segment `s` and enter its dest (guards already passed); False: refused."""
    for name in edge.effects:
        if not EFFECTS[name](topo, move, s, actor):
            return False
    move.segs[s] = move.segs[s]._replace(state=edge.dest)
    return True


def fire(topo: Topology, move: Move, s: int, edge: Compiled | None, actor: int) -> bool:
    """Guard and apply `edge` on segment `s` of the move; False when absent, refused or out of bound."""
    if edge is None or not passes(edge, WorldView(topo, move, s, actor)):
        return False
    return apply(topo, move, s, edge, actor)


def _edit(move: Move, s: int, **fields: int) -> bool:
    move.segs[s] = move.segs[s]._replace(**fields)
    return True


def _take_slot(topo: Topology, move: Move, s: int, actor: int) -> bool:
    free = move.free_slots
    assert free != 0, "guard slot_available must precede take_slot"
    slot = (free & -free).bit_length() - 1
    move.free_slots = free & ~(1 << slot)
    return _edit(move, s, slot=slot)


def _free_slot(topo: Topology, move: Move, s: int, actor: int) -> bool:
    slot = move.segs[s].slot
    assert slot >= 0, "free_slot on a segment without a slot"
    move.free_slots |= 1 << slot
    return _edit(move, s, slot=-1)


def _bump_version(topo: Topology, move: Move, s: int, actor: int) -> bool:
    version = move.segs[s].version
    return version < topo.config.version_cap and _edit(move, s, version=version + 1)


def _lease(add: bool) -> Effect:
    def apply_lease(topo: Topology, move: Move, s: int, actor: int) -> bool:
        assert actor >= 0, "lease effects need an acting request"
        leases = move.segs[s].leases
        return _edit(move, s, leases=(leases | 1 << actor) if add else (leases & ~(1 << actor)))
    return apply_lease


def _set(**fields: int) -> Effect:
    def apply_set(topo: Topology, move: Move, s: int, actor: int) -> bool:
        return _edit(move, s, **fields)
    return apply_set


def _delta(field: str, by: int) -> Effect:
    def apply_delta(topo: Topology, move: Move, s: int, actor: int) -> bool:
        return _edit(move, s, **{field: getattr(move.segs[s], field) + by})
    return apply_delta


def _set_owner(topo: Topology, move: Move, s: int, actor: int) -> bool:
    assert actor >= 0, "set_owner needs an acting request"
    return _edit(move, s, owner=actor)


def _freeze(topo: Topology, move: Move, s: int, actor: int) -> bool:
    return _edit(move, s, frozen=move.segs[s].rows)


def _seal_rows(topo: Topology, move: Move, s: int, actor: int) -> bool:
    """The size becomes the rows written; a seal at the full size is stored as -1 (one world, not two)."""
    rows = move.segs[s].rows
    return _edit(move, s, cap=-1 if rows >= topo.config.rows_per_segment else rows)


def _reference_edge(topo: Topology, move: Move, t: int, events: tuple[int | None, ...]) -> Compiled | None:
    """The edge of segment `t`'s reference event (hold or unhold) in its current state, if any."""
    event = events[t]
    return None if event is None else topo.seg_table[t].rows[move.segs[t].state][event]


def _hold_references(topo: Topology, move: Move, s: int, actor: int) -> bool:
    """Fire `hold` on every referenced segment not yet held by this entry where the spec allows it."""
    refs = move.segs[s].refs
    for i, t in enumerate(topo.ref_targets[s]):
        if refs >> i & 1:
            continue
        edge = _reference_edge(topo, move, t, topo.hold_event)
        if edge is None or not passes(edge, WorldView(topo, move, t, -1)):
            continue  # not holdable yet (e.g. still being written): a later attach picks it up
        if not apply(topo, move, t, edge, -1):
            return False
        refs |= 1 << i
    return _edit(move, s, refs=refs)


def _drop_references(topo: Topology, move: Move, s: int, actor: int) -> bool:
    """Fire `unhold` on every segment this entry holds; refused as a whole if any unhold is refused."""
    refs = move.segs[s].refs
    for i, t in enumerate(topo.ref_targets[s]):
        if refs >> i & 1 and not fire(topo, move, t, _reference_edge(topo, move, t, topo.unhold_event), -1):
            return False
    return _edit(move, s, refs=0)


EFFECTS: Mapping[str, Effect] = MappingProxyType({
    "take_slot": _take_slot,
    "free_slot": _free_slot,
    "set_owner": _set_owner,
    "clear_owner": _set(owner=-1),
    "append_row": _delta("rows", 1),
    "clear_rows": _set(rows=0, frozen=-1, cap=-1, unknown=0),
    "seal_rows": _seal_rows,
    "freeze_content": _freeze,
    "add_lease": _lease(add=True),
    "drop_lease": _lease(add=False),
    "pin_copy": _set(copy=1),
    "unpin_copy": _set(copy=0),
    "bump_version": _bump_version,
    "add_holder": _delta("holders", 1),
    "drop_holder": _delta("holders", -1),
    "take_row": _set(row=1),
    "free_row": _set(row=0),
    "hold_references": _hold_references,
    "drop_references": _drop_references,
    "mark_ahead": _set(unknown=1),
})

ACTOR_GUARDS = frozenset({"is_owner", "leased_by_actor", "not_leased_by_actor", "targets_filling"})
ACTOR_EFFECTS = frozenset({"set_owner", "add_lease", "drop_lease"})
