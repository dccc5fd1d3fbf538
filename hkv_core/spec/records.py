"""Frozen, typed records the lifecycle spec is loaded into."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

SELF_DEST = "="  # a transition whose dest is "=" stays in its source state


@attrs.frozen(kw_only=True)
class TransitionSpec:
    """One `(source, event) -> dest` edge with its named guards and effects."""

    kind: str
    source: str
    event: str
    dest: str
    guards: tuple[str, ...]
    effects: tuple[str, ...]


@attrs.frozen(kw_only=True)
class KindSpec:
    """The lifecycle of one object kind."""

    name: str
    description: str
    initial: str
    final: frozenset[str]
    states: tuple[str, ...]
    transitions: tuple[TransitionSpec, ...]

    @property
    def events(self) -> tuple[str, ...]:
        """Every event this kind reacts to, in first-use order."""
        return tuple(dict.fromkeys(t.event for t in self.transitions))

    def transition(self, state: str, event: str) -> TransitionSpec | None:
        """The unique transition for `(state, event)`, or None."""
        for t in self.transitions:
            if t.source == state and t.event == event:
                return t
        return None


@attrs.frozen(kw_only=True)
class InvariantSpec:
    """A named invariant, the failure class (docs/failures.md row) it guards against."""

    name: str
    failure: str
    description: str


@attrs.frozen(kw_only=True)
class LifecycleSpec:
    """The whole lifecycle spec: kinds, their transitions and the invariants."""

    source: str
    version: int
    device_kinds: tuple[str, ...]
    index_kinds: tuple[str, ...]
    lease_events: frozenset[str]
    reference_events: frozenset[str]
    device_resident_states: frozenset[str]
    frozen_states: frozenset[str]
    copy_states: frozenset[str]
    indexable_states: frozenset[str]
    snapshot_kinds: frozenset[str]  # device kinds whose objects hold one position's state (resume points only)
    references: Mapping[str, tuple[str, ...]]  # index kind -> the device kinds it refers to
    kinds: Mapping[str, KindSpec]
    invariants: tuple[InvariantSpec, ...]

    def kind(self, name: str) -> KindSpec:
        """The KindSpec called `name` (KeyError if absent: a programmer error)."""
        return self.kinds[name]

    @property
    def record_kinds(self) -> tuple[str, ...]:
        """Kinds that are neither device nor index kinds (the tier load)."""
        return tuple(k for k in self.kinds if k not in self.device_kinds and k not in self.index_kinds)
