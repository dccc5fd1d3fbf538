"""PagePool: the sole owner of one page pool's cached objects and device slots.

Objects (ids 1..n-1; 0 is the NULL object) are what the prefix index and
leases refer to; a device slot (a page id of the member pools) is one
placement of an object, recorded in `slot` / `slot_object` (host and disk
records will be others).  Per object the pool keeps: lifecycle state,
version, lease pins, copy pins, index references (`holders`), owner (a
request slot), the token positions at which its first and its last row are
written (`row_token`, `full_token`), its slot and its disk record state.

Every change of any of these is an event of the compiled lifecycle table,
applied in bulk: `step(objs, event)` gathers the objects' states, asks the
table for the edge of each distinct source state (guards read this pool's
arrays and the request table through `PoolView`), and only when every group
passes runs the edge's effects (`pool_effects.EFFECTS`) and moves the states;
a refused step raises IllegalTransition and changes nothing.  Objects in the
initial state (FREE) are absent: their ids wait on a free stack, as free
slots do (both hand out the lowest id first).

Versions are stamps from a per-pool clock, unique over the pool's life: a
(page, version) pair names one placement of one object, so a plan that read
page p of an object that has since left it can never pass a check.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from hkv_core.errors import IllegalTransition
from hkv_core.manager import pool_effects
from hkv_core.manager.lanes import LaneSpec
from hkv_core.manager.pool_view import PoolView
from hkv_core.manager.requests import RequestTable
from hkv_core.spec.names import Event, State
from hkv_core.spec.table import Compiled, KindTable

NULL_OBJECT = 0
NO_OWNER = -1
Index = NDArray[np.intp]
Ids = NDArray[np.int32]
EMPTY = np.zeros(0, np.intp)
DISK_DURABLE = 2  # record states: 0 absent (no disk tier writes records yet)
COMMON_EVENTS = (Event.RESERVE, Event.FILL, Event.COPY_DONE, Event.COPY_FAIL, Event.ABORT, Event.PUBLISH,
                 Event.PUBLISH_PINNED, Event.PIN, Event.UNPIN, Event.HOLD, Event.UNHOLD, Event.EVICT)
OPTIONAL_EVENTS = (Event.SEAL, Event.RETIRE, Event.RECLAIM)  # resolved when the kind declares them


class PagePool:
    """Objects and device slots of one page pool; see the module docstring."""

    def __init__(self, spec: LaneSpec, table: KindTable, requests: RequestTable) -> None:
        n = spec.pages
        assert n >= 2, f"{spec.name}: the NULL page and at least one real page"
        self.spec, self.table, self.requests = spec, table, requests
        self.state = np.full(n, table.initial, np.uint8)
        self.version = np.arange(n, dtype=np.int64)  # unique stamps from the start
        self.clock = n
        self.leases = np.zeros(n, np.int32)
        self.copies = np.zeros(n, np.int32)
        self.holders = np.zeros(n, np.int32)
        self.owner = np.full(n, NO_OWNER, np.int32)
        self.row_token = np.zeros(n, np.int64)
        self.full_token = np.zeros(n, np.int64)
        self.slot = np.zeros(n, np.int32)  # object -> device page (NULL_OBJECT: none)
        self.slot_object = np.zeros(n, np.int32)  # device page -> object
        self.record = np.zeros(n, np.uint8)
        self.stamp = np.zeros(n, np.int64)  # scratch for lease-membership guards
        self.vdrop = np.zeros(n, np.int32)  # scratch of the eviction planner: references it would drop
        self.stamp_clock = 0
        self.free_objects = np.arange(n - 1, NULL_OBJECT, -1, dtype=np.int32)  # stacks: pop gives low ids first
        self.free_object_count = n - 1
        self.free_slots = self.free_objects.copy()
        self.free_slot_count = n - 1
        self.ev = {e: table.event_id(e) for e in COMMON_EVENTS}
        self.ev.update({e: table.event_index[e] for e in OPTIONAL_EVENTS if e in table.event_index})
        self.s_free = table.initial
        self.s_reserved = table.state_id(State.RESERVED)
        self.s_ready = table.state_id(State.READY)
        self.s_published = table.state_id(State.PUBLISHED)
        self.s_retired = table.state_index.get(State.RETIRED, -1)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def free_count(self) -> int:
        """Objects that can be reserved now (a free object id and a free device slot each)."""
        return min(self.free_object_count, self.free_slot_count)

    # ------------------------------------------------------------------ steps

    def step(self, objs: Index, event: int, actor: int = NO_OWNER, counts: Index | None = None) -> None:
        """Move every object of `objs` (distinct) by `event`; all or nothing (IllegalTransition changes nothing).

        `counts` (one per object) scales the counting effects (index references).
        """
        if not objs.size:
            return
        states = self.state[objs]
        first = states[0]
        if objs.size == 1 or not np.count_nonzero(states != first):
            edge = self.table.step(int(first), event, PoolView(self, objs, actor))
            self._apply(int(first), objs, edge, actor, counts)
            return
        groups = [(int(s), states == s) for s in np.flatnonzero(np.bincount(states))]
        plan = [self.table.step(s, event, PoolView(self, objs[mask], actor)) for s, mask in groups]
        for (s, mask), edge in zip(groups, plan, strict=True):
            self._apply(s, objs[mask], edge, actor, None if counts is None else counts[mask])

    def _apply(self, state: int, objs: Index, edge: Compiled, actor: int, counts: Index | None) -> None:
        """Run an edge's effects on objects all in `state` (its guards passed) and move them."""
        assert state != self.s_free or int(objs.min()) > NULL_OBJECT, "the NULL object never moves"
        for name in edge.effects:
            pool_effects.EFFECTS[name](self, objs, actor, counts)
        if edge.dest != state:
            self.state[objs] = edge.dest
            if edge.dest == self.s_free:
                self._push(self.free_objects, "free_object_count", objs)

    def reserve(self, count: int, actor: int, row_token: NDArray[np.int64] | int,
                full_token: NDArray[np.int64] | int) -> Index:
        """`count` FREE objects (lowest ids first) owned by `actor`, each placed in a free slot (F8).

        The guard `slot_available` reads the free slots; IllegalTransition and
        nothing taken when too few are left.
        """
        if not count:
            return EMPTY
        assert count <= self.free_object_count, "caller counted free objects first"
        top = self.free_object_count
        objs = self.free_objects[top - count:top][::-1].astype(np.intp)
        self.step(objs, self.ev[Event.RESERVE], actor)
        self.free_object_count = top - count
        self.row_token[objs] = row_token
        self.full_token[objs] = full_token
        return objs

    def take_slots(self, objs: Index) -> None:
        """The take_slot effect: the lowest free device pages become the objects' placements."""
        count, top = objs.size, self.free_slot_count
        assert count <= top, "guard slot_available precedes take_slot"
        slots = self.free_slots[top - count:top][::-1]
        self.free_slot_count = top - count
        self.slot[objs] = slots
        self.slot_object[slots] = objs

    def free_placements(self, objs: Index) -> None:
        """The free_slot effect: the objects' device pages go back to the free stack."""
        slots = self.slot[objs]
        self.slot_object[slots] = NULL_OBJECT
        self.slot[objs] = NULL_OBJECT
        self._push(self.free_slots, "free_slot_count", slots)

    def _push(self, stack: Ids, count_name: str, ids: NDArray[np.integer]) -> None:
        top = getattr(self, count_name)
        stack[top:top + ids.size] = np.sort(ids)[::-1]  # the stack hands out low ids first
        setattr(self, count_name, top + ids.size)

    def bump(self, objs: Index) -> None:
        """The bump_version effect: fresh stamps, unique over the pool's life."""
        self.version[objs] = np.arange(self.clock, self.clock + objs.size, dtype=np.int64)
        self.clock += objs.size

    # ------------------------------------------------------------------ compound uses

    def settle(self, objs: Index) -> None:
        """Distinct objects that just lost index references or pins: free what nobody holds or pins any more.

        PUBLISHED and unreferenced: evicted when unpinned, retired (if the kind
        retires) while a request still pins it; RETIRED and unpinned: reclaimed.
        """
        state = self.state[objs]
        loose = (self.holders[objs] == 0) & (state == self.s_published)
        retired = state == self.s_retired
        if not np.count_nonzero(loose | retired):
            return
        idle = (self.leases[objs] == 0) & (self.copies[objs] == 0)
        self.step(objs[loose & idle], self.ev[Event.EVICT])
        if self.s_retired >= 0:
            self.step(objs[loose & ~idle], self.ev[Event.RETIRE])
            self.step(objs[retired & idle], self.ev[Event.RECLAIM])

    def lease_mark(self, pinned: NDArray[np.integer], objs: Index) -> NDArray[np.bool_]:
        """Which of `objs` appear in `pinned` (one request's lease list): two scatters, no sort."""
        self.stamp_clock += 1
        self.stamp[pinned] = self.stamp_clock
        return np.asarray(self.stamp[objs] == self.stamp_clock)

    def state_name(self, obj: int) -> str:
        return self.table.states[int(self.state[obj])]

    def check_op(self, page: int, version: int) -> tuple[bool, int, str]:
        """Is `page` still the placement of an object at `version` that may be read? (ok, version, state)."""
        obj = int(self.slot_object[page]) if 0 <= page < len(self.slot_object) else NULL_OBJECT
        if obj == NULL_OBJECT:
            return False, -1, self.table.states[self.s_free]
        found, state = int(self.version[obj]), int(self.state[obj])
        readable = state in (self.s_published, self.s_retired)
        return found == version and readable, found, self.table.states[state]

    def clone(self, requests: RequestTable) -> PagePool:
        twin = object.__new__(PagePool)
        twin.__dict__.update(self.__dict__)
        for name, value in self.__dict__.items():
            if isinstance(value, np.ndarray):
                setattr(twin, name, value.copy())
        twin.requests = requests
        return twin


def refuse(pool: PagePool, obj: int, event: Event, guard: str) -> IllegalTransition:
    """An IllegalTransition naming `obj`'s state, for refusals found before a step."""
    return IllegalTransition(kind=pool.table.kind, state=pool.state_name(obj), event=event.value, guard=guard)
