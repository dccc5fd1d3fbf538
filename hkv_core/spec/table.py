"""The compiled transition table: the hot-path form of the lifecycle spec.

States and events become small ints; `rows[state][event]` is a `Compiled`
edge or None.  A step is two list indexings plus the guards - no
`transitions.Machine` is ever built per segment.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from hkv_core.errors import IllegalTransition, SpecError
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
    source: str = "<spec>"

    def event_id(self, event: str) -> int:
        """The index of `event` (an `Event`); SpecError when this kind has no such event."""
        return self._resolve(self.event_index, event, "fires event", "transitions")

    def state_id(self, state: str) -> int:
        """The index of `state` (a `State`); SpecError when this kind has no such state."""
        return self._resolve(self.state_index, state, "names state", "states")

    def _resolve(self, index: Mapping[str, int], name: str, use: str, key: str) -> int:
        found = index.get(name)
        if found is None:
            raise SpecError(f"the code {use} {name!r}, which this kind does not declare",
                            file=self.source, table=f"kinds.{self.kind}", key=key)
        return found

    def states_mask(self, names: frozenset[str]) -> tuple[bool, ...]:
        """Per state index: is the state one of `names`."""
        return tuple(s in names for s in self.states)

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


def compile_kind(kind: KindSpec, source: str = "<spec>") -> KindTable:
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
                     rows=tuple(tuple(r) for r in rows), source=source)


def compile_lifecycle(spec: LifecycleSpec) -> dict[str, KindTable]:
    """Compile every kind of the spec."""
    return {name: compile_kind(kind, spec.source) for name, kind in spec.kinds.items()}
