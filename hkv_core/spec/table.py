"""The compiled transition table: the hot-path form of the lifecycle spec.

States and events become small ints; `rows[state][event]` is a `Compiled`
edge or None.  A step is two list indexings plus the guards - no
`transitions.Machine` is ever built per segment.
"""

from __future__ import annotations

import attrs

from hkv_core.errors import IllegalTransition
from hkv_core.spec.guards import GUARDS, Guard, GuardView, first_refusing
from hkv_core.spec.records import KindSpec, LifecycleSpec


@attrs.frozen(kw_only=True)
class Compiled:
    """One compiled edge: destination index, guard callables and effect names."""

    dest: int
    guard_names: tuple[str, ...]
    guards: tuple[Guard, ...]
    effects: tuple[str, ...]


@attrs.frozen(kw_only=True)
class KindTable:
    """The compiled table of one kind."""

    kind: str
    states: tuple[str, ...]
    events: tuple[str, ...]
    state_index: dict[str, int]
    event_index: dict[str, int]
    initial: int
    rows: tuple[tuple[Compiled | None, ...], ...]

    def edge(self, state: int, event: int) -> Compiled | None:
        """The edge for (state, event) or None when the spec has none."""
        return self.rows[state][event]

    def step(self, state: int, event: int, view: GuardView | None) -> Compiled:
        """The edge to take, or IllegalTransition (nothing changes on refusal)."""
        edge = self.rows[state][event]
        if edge is None:
            raise IllegalTransition(kind=self.kind, state=self.states[state], event=self.events[event])
        if edge.guards:
            assert view is not None, "a guarded transition needs a GuardView"
            refused = first_refusing(edge.guards, edge.guard_names, view)
            if refused is not None:
                raise IllegalTransition(kind=self.kind, state=self.states[state],
                                        event=self.events[event], guard=refused)
        return edge


def compile_kind(kind: KindSpec) -> KindTable:
    """Compile one kind's transitions into an indexed table."""
    states, events = kind.states, kind.events
    s_index = {s: i for i, s in enumerate(states)}
    e_index = {e: i for i, e in enumerate(events)}
    rows: list[list[Compiled | None]] = [[None] * len(events) for _ in states]
    for t in kind.transitions:
        assert rows[s_index[t.source]][e_index[t.event]] is None, "loader rejects duplicates"
        rows[s_index[t.source]][e_index[t.event]] = Compiled(
            dest=s_index[t.dest], guard_names=t.guards,
            guards=tuple(GUARDS[g] for g in t.guards), effects=t.effects)
    return KindTable(kind=kind.name, states=states, events=events, state_index=s_index,
                     event_index=e_index, initial=s_index[kind.initial],
                     rows=tuple(tuple(r) for r in rows))


def compile_lifecycle(spec: LifecycleSpec) -> dict[str, KindTable]:
    """Compile every kind of the spec."""
    return {name: compile_kind(kind) for name, kind in spec.kinds.items()}
