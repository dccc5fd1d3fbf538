"""Lifecycle rules over every device kind at once: the compiled tables, indexed by object code.

The page pools keep one lifecycle state per object as a *code*: the kind's
offset plus its state index (kinds in spec order; fewer than 256 codes).  For
each event the code fires, `EventRule.dest[code]` is the destination code
(-1 where the spec has no transition) and `edges[code]` the compiled edge.
Edges of an event that share guards and effects form a variant; when the
objects of a step fall in one variant (always, on the manager's hot paths),
one evaluation of the guards and one application of each effect covers a
step over objects of any pools, kinds and states; otherwise the step falls
back to one group per code.
"""

from __future__ import annotations

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.object_effects import Effect, runnable
from hkv_core.spec.guards import Guard
from hkv_core.spec.names import Event
from hkv_core.spec.table import Compiled, KindTable


@attrs.frozen(kw_only=True)
class Variant:
    """The guards and effects some edges of an event share, and where those edges go."""

    guards: tuple[Guard, ...]
    guard_names: tuple[str, ...]
    effects: tuple[str, ...]
    run: tuple[Effect, ...]  # the effects' implementations, no-ops left out
    self_loop: bool  # every such edge stays in its state
    to_initial: bool  # every such edge ends in its kind's initial (absent) state


@attrs.frozen(kw_only=True)
class EventRule:
    """One event over all codes: destinations, edges, and the variants of guards/effects they share."""

    event: Event
    dest: NDArray[np.int16]  # per code: destination code, or -1
    legal: NDArray[np.bool_]  # per code: has an edge (dest >= 0)
    edges: tuple[Compiled | None, ...]  # per code
    runs: tuple[tuple[Effect, ...], ...]  # per code: its edge's effects, no-ops left out (the fallback's)
    variant: NDArray[np.int8]  # per code: index into `variants` (-1: no edge)
    variants: tuple[Variant, ...]
    single: Variant | None  # the one variant, when there is one (the usual case)


@attrs.frozen(kw_only=True)
class Codes:
    """The code space of some kinds: code = offsets[kind] + state."""

    kinds: tuple[str, ...]
    tables: tuple[KindTable, ...]
    offsets: tuple[int, ...]
    kind_of: NDArray[np.uint8]  # per code
    state_of: NDArray[np.uint8]  # per code
    initial: NDArray[np.bool_]  # per code: the kind's initial state

    @classmethod
    def of(cls, tables: dict[str, KindTable], kinds: tuple[str, ...]) -> Codes:
        offsets: list[int] = []
        kind_of: list[int] = []
        state_of: list[int] = []
        initial: list[bool] = []
        for k, name in enumerate(kinds):
            table = tables[name]
            offsets.append(len(kind_of))
            kind_of += [k] * len(table.states)
            state_of += list(range(len(table.states)))
            initial += [s == table.initial for s in range(len(table.states))]
        assert len(kind_of) < 256, "codes fit a byte"
        return cls(kinds=kinds, tables=tuple(tables[k] for k in kinds), offsets=tuple(offsets),
                   kind_of=np.array(kind_of, np.uint8), state_of=np.array(state_of, np.uint8),
                   initial=np.array(initial, np.bool_))

    @property
    def size(self) -> int:
        return len(self.kind_of)

    def code(self, kind: int, state: int) -> int:
        return self.offsets[kind] + state

    def describe(self, code: int) -> tuple[str, str]:
        """(kind name, state name) of a code."""
        table = self.tables[int(self.kind_of[code])]
        return table.kind, table.states[int(self.state_of[code])]

    def rule(self, event: Event) -> EventRule:
        dest = np.full(self.size, -1, np.int16)
        edges: list[Compiled | None] = [None] * self.size
        for k, table in enumerate(self.tables):
            e = table.event_index.get(event)
            if e is None:
                continue
            for s, row in enumerate(table.rows):
                edge = row[e]
                if edge is not None:
                    code = self.offsets[k] + s
                    edges[code], dest[code] = edge, self.offsets[k] + edge.dest
        present = [(c, edge) for c, edge in enumerate(edges) if edge is not None]
        assert present, f"no kind of these pools declares event {event}"
        groups: dict[tuple[tuple[str, ...], tuple[str, ...]], list[int]] = {}
        for c, edge in present:
            groups.setdefault((edge.guard_names, edge.effects), []).append(c)
        variant = np.full(self.size, -1, np.int8)
        variants = []
        for v, codes in enumerate(groups.values()):
            first = edges[codes[0]]
            assert first is not None
            variant[codes] = v
            variants.append(Variant(guards=first.guards, guard_names=first.guard_names, effects=first.effects,
                                    run=runnable(first.effects),
                                    self_loop=all(dest[c] == c for c in codes),
                                    to_initial=all(self.initial[dest[c]] for c in codes)))
        runs = tuple(runnable(e.effects) if e is not None else () for e in edges)
        return EventRule(event=event, dest=dest, legal=dest >= 0, edges=tuple(edges), runs=runs, variant=variant,
                         variants=tuple(variants), single=variants[0] if len(variants) == 1 else None)
