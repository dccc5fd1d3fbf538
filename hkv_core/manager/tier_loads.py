"""TierLoads: the tier loads in flight, each a `tier_load` of the lifecycle spec (docs/tiers.md).

A load plan (record_plans.issue_load) copies tier records into objects a request reserved.  Each record it
copies is one tier load, keyed by (plan id, record name), and moves only through the compiled `tier_load`
table:

- `load` (IDLE -> LOADING) when the plan is issued, after its targets' `fill`: guard `targets_filling`
  (every object the record writes is FILLING for the issuing request, copy-pinned);
- `copy_done` or `copy_fail` (LOADING -> IDLE) when the plan completes, before its targets settle.

Effects: `pin_copy` pins the load and marks each target in `PagePools.loads`, which the targets' own
`copy_done` / `copy_fail` guard `no_load_in_flight` reads - so a target leaves FILLING after its load has
settled, never while the load may still write it; `unpin_copy` undoes both.  An IDLE load is gone: nothing
of it is kept.  A record at rest is not the manager's: its tier checks it whenever it is read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.arrays import all_true
from hkv_core.errors import SpecError
from hkv_core.manager.page_pools import PagePools
from hkv_core.spec.names import Event
from hkv_core.spec.table import Compiled, KindTable

Index = NDArray[np.intp]
KIND = "tier_load"


@attrs.define
class TierLoad:
    """One record a load plan copies: the objects it writes, the request (slot) that issued it, its state."""

    plan_id: int
    record: str
    targets: Index
    actor: int
    state: int
    copies: int = 0


class LoadView:
    """GuardView over one tier load: its targets' states, owners and copy pins."""

    __slots__ = ("objects", "load")

    def __init__(self, objects: PagePools, load: TierLoad) -> None:
        self.objects, self.load = objects, load

    def targets_filling(self) -> bool:
        o, targets = self.objects, self.load.targets
        return bool(targets.size) and all_true(o.filling[o.code[targets].astype(np.intp)]
                                               & (o.owner[targets] == self.load.actor) & (o.copies[targets] > 0))

    def copy_pinned(self) -> bool:
        return self.load.copies > 0

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"guard question {name!r} asked of a tier load")


def _pin(loads: TierLoads, load: TierLoad, by: int) -> None:
    load.copies += by
    np.add.at(loads.objects.loads, load.targets, by)


LOAD_EFFECTS: Mapping[str, Callable[[TierLoads, TierLoad], None]] = {
    "pin_copy": lambda loads, load: _pin(loads, load, 1),
    "unpin_copy": lambda loads, load: _pin(loads, load, -1),
}


class TierLoads:
    """The tier loads in flight, by (plan id, record name)."""

    FIRES = (Event.LOAD, Event.COPY_DONE, Event.COPY_FAIL)

    def __init__(self, table: KindTable, objects: PagePools) -> None:
        """SpecError when the spec's `tier_load` lacks an event fired here or names an effect the manager
        does not implement for it."""
        self.table, self.objects = table, objects
        self.events = {e: table.event_id(e) for e in self.FIRES}
        for row in table.rows:
            for edge in row:
                unknown = sorted(set(edge.effects) - set(LOAD_EFFECTS)) if edge is not None else []
                if unknown:
                    raise SpecError(f"the manager implements no effect {unknown[0]!r} on a tier load",
                                    file=table.source, table=f"kinds.{KIND}", key="transitions")
        self.loads: dict[tuple[int, str], TierLoad] = {}

    def begin(self, plan_id: int, targets: Mapping[str, Index], actor: int) -> None:
        """Fire `load` for each record of plan `plan_id` (its targets already FILLING); all or nothing
        (IllegalTransition, nothing changed, when the table or a guard refuses one)."""
        steps = []
        for record, objs in targets.items():
            load = TierLoad(plan_id=plan_id, record=record, targets=objs, actor=actor, state=self.table.initial)
            steps.append((load, self.table.step(load.state, self.events[Event.LOAD], LoadView(self.objects, load))))
        for load, edge in steps:
            self._apply(load, edge, Event.LOAD)
            self.loads[(plan_id, load.record)] = load

    def settle(self, plan_id: int, ok: bool) -> None:
        """Fire `copy_done` (or `copy_fail`) on every load of plan `plan_id`; a load back in IDLE is dropped."""
        event = Event.COPY_DONE if ok else Event.COPY_FAIL
        mine = [key for key in self.loads if key[0] == plan_id]
        steps = [(key, self.table.step(self.loads[key].state, self.events[event],
                                       LoadView(self.objects, self.loads[key]))) for key in mine]
        for key, edge in steps:
            self._apply(self.loads[key], edge, event)
            if edge.dest == self.table.initial:
                del self.loads[key]

    def _apply(self, load: TierLoad, edge: Compiled, event: Event) -> None:
        for name in edge.effects:
            LOAD_EFFECTS[name](self, load)
        load.state = edge.dest
        self.objects.generation += 1
        if self.objects.seen is not None:
            self.objects.seen.add((KIND, event.value))

    def clone(self, objects: PagePools) -> TierLoads:
        twin = TierLoads.__new__(TierLoads)
        twin.__dict__.update(self.__dict__)
        twin.objects = objects
        twin.loads = {key: attrs.evolve(load) for key, load in self.loads.items()}
        return twin

    def snapshot(self) -> tuple[Any, ...]:
        return tuple((key, load.state, load.copies, load.actor, load.targets.tobytes())
                     for key, load in sorted(self.loads.items()))
