"""PagePools: the sole owner of the cached objects and device slots of every page pool of a manager.

Objects are what the prefix index and leases refer to; a device slot (a page
id of a pool's member pools) is one placement of an object, recorded in
`slot` / `PoolSlots.slot_object` (tier records are the tiers': hkv_tiers).
Object ids are global across the pools (0 is the NULL object; pool p owns
the ids [base, base + pages - 1)), so one lifecycle step moves objects of
any pools at once.  Per object: lifecycle code (kind and state, see
rules.py), version, lease pins, copy pins, index references (`holders`),
owner (a request slot), the token positions at which its first and its last
row are written (`row_token`, `full_token`), its page and pool, and the
tier loads in flight that write it (`loads`, kept by tier_loads.py).

Every change of any of these is an event of the compiled lifecycle tables,
applied in bulk by `step(objs, event)`: the destination of every object is
looked up by code; the event's guards (read through `ObjectView` from these
arrays and the request table) are evaluated once over all objects; only when
every object passes do the effects (`object_effects.EFFECTS`) run and the
codes move.  A refused step raises IllegalTransition and changes nothing.
Objects in their kind's initial state (FREE) are absent: their ids wait on
their pool's free stack, as free slots do (both hand out the lowest first).

Versions are stamps from one clock, unique over the manager's life: a
(page, version) pair names one placement of one object, so a plan that read
a page whose object has since left it can never pass a check.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hkv_core.arrays import all_true, any_true
from hkv_core.errors import IllegalTransition
from hkv_core.manager.lanes import LaneSpec
from hkv_core.manager.object_view import ObjectView
from hkv_core.manager.requests import RequestTable
from hkv_core.manager.rules import Codes, EventRule
from hkv_core.spec.guards import first_refusing
from hkv_core.spec.names import Event, State
from hkv_core.spec.table import KindTable

NULL_OBJECT = 0
NO_OWNER = -1
Index = NDArray[np.intp]
EMPTY = np.zeros(0, np.intp)
FIRED = (Event.RESERVE, Event.ABORT, Event.PIN, Event.UNPIN, Event.HOLD, Event.UNHOLD, Event.EVICT,  # on every pool
         Event.RESERVE_DRAFT, Event.ACCEPT, Event.REJECT, Event.RESERVE_AHEAD, Event.VERIFY)
# (each role adds its own: Role.FIRES)


def _push(stack: NDArray[np.int32], top: int, ids: NDArray[np.integer]) -> int:
    """Push `ids` on a free stack (highest first, so that pops hand out low ids first); the new top."""
    n = ids.size
    stack[top:top + n] = np.sort(ids)[::-1] if n > 1 else ids
    return top + n


class SlotSpace:
    """Device pages (block ids 1 .. slots - 1; 0 is the NULL page) and the stack of the free ones, from which
    one pool draws (its own space) or every pool of a manager does (`ManagerConfig.shared_pages`: a block is
    one pool's page at a time, and a freed block may be taken next by any pool)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.free = np.arange(slots - 1, 0, -1, dtype=np.int32)  # a stack: pop gives low ids first
        self.count = slots - 1

    def pop(self, count: int) -> NDArray[np.int32]:
        """The `count` lowest free pages, taken."""
        top = self.count
        self.count = top - count
        return self.free[top - count:top][::-1].copy()

    def push(self, pages: NDArray[np.integer]) -> None:
        self.count = _push(self.free, self.count, pages)

    def clone(self) -> SlotSpace:
        twin = object.__new__(SlotSpace)
        twin.__dict__.update(self.__dict__)
        twin.free = self.free.copy()
        return twin


class PoolSlots:
    """One page pool's device pages and object ids: its spec, page -> object map, its slot space (its own, or
    the manager's shared one) and its free object ids."""

    def __init__(self, spec: LaneSpec, base: int, space: SlotSpace | None = None) -> None:
        n = spec.pages
        self.spec, self.index, self.base, self.size = spec, spec.index, base, n - 1
        self.space = SlotSpace(spec.slots) if space is None else space
        self.shared = space is not None  # draws its pages from a space other pools draw from too
        self.slot_object = np.zeros(spec.slots, np.int32)  # device page -> global object (NULL_OBJECT: none)
        self.free_objects = np.arange(base + n - 2, base - 1, -1, dtype=np.int32)  # global ids, low first
        self.free_object_count = n - 1

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def free_slot_count(self) -> int:
        """Free pages of the pool's space (shared: free for any pool of it)."""
        return self.space.count

    @property
    def free_count(self) -> int:
        """Objects that can be reserved now (a free object id and a free page each)."""
        return min(self.free_object_count, self.space.count)

    @property
    def own_free(self) -> int:
        """What this pool alone can still take: its free object ids (the space's pages counted apart) when its
        space is shared, else `free_count`."""
        return self.free_object_count if self.shared else self.free_count

    def pop_slots(self, count: int) -> NDArray[np.int32]:
        """The `count` lowest free pages of the space, taken."""
        return self.space.pop(count)

    def push_slots(self, pages: NDArray[np.integer]) -> None:
        self.space.push(pages)

    def push_objects(self, objs: NDArray[np.integer]) -> None:
        self.free_object_count = _push(self.free_objects, self.free_object_count, objs)

    def clone(self, space: SlotSpace | None = None) -> PoolSlots:
        """A copy; its space is `space` (a shared space's clone, made once for all its pools) or its own's."""
        twin = object.__new__(PoolSlots)
        twin.__dict__.update(self.__dict__)
        twin.space = space if space is not None else self.space.clone()
        for name in ("slot_object", "free_objects"):
            setattr(twin, name, getattr(self, name).copy())
        return twin


class PagePools:
    """Objects and device slots of every page pool; see the module docstring."""

    def __init__(self, lanes: tuple[LaneSpec, ...], tables: dict[str, KindTable], requests: RequestTable,
                 fired: dict[int, tuple[Event, ...]], shared_space: bool = False) -> None:
        """`fired[pool]`: the events the manager fires on that pool's objects (its role's), checked against the
        spec here: SpecError when the pool's kind does not declare one.  `shared_space`: every pool draws its
        pages from one space of `lanes[0].slots` page ids (all lanes have that many)."""
        assert not shared_space or len({lane.slots for lane in lanes}) == 1, "one space: one size"
        kinds = tuple(dict.fromkeys(lane.kind for lane in lanes))
        self.codes = Codes.of(tables, kinds)
        self.requests = requests
        bases = np.cumsum([1] + [lane.pages - 1 for lane in lanes])
        shared = SlotSpace(lanes[0].slots) if shared_space else None
        self.pools = tuple(PoolSlots(lane, int(b), shared) for lane, b in zip(lanes, bases, strict=False))
        self.spaces: tuple[SlotSpace, ...] = (shared,) if shared is not None else ()  # drawn from by every pool
        n = int(bases[-1])
        kind = np.array([kinds.index(lane.kind) for lane in lanes], np.intp)
        self.pool = np.concatenate([[0], np.repeat(np.arange(len(lanes)), [lane.pages - 1 for lane in lanes])])
        self.pool = self.pool.astype(np.intp)
        self.code = np.array([self.codes.code(int(k), self.codes.tables[k].initial) for k in kind], np.uint8)[self.pool]
        self.version = np.arange(n, dtype=np.int64)  # unique stamps from the start
        self.clock = n
        self.leases = np.zeros(n, np.int32)
        self.copies = np.zeros(n, np.int32)
        self.holders = np.zeros(n, np.int32)
        self.owner = np.full(n, NO_OWNER, np.int32)
        self.row_token = np.zeros(n, np.int64)
        self.full_token = np.zeros(n, np.int64)
        self.slot = np.zeros(n, np.int32)  # object -> device page of its pool (NULL_OBJECT: none)
        self.loads = np.zeros(n, np.int32)  # tier loads in flight writing the object (tier_loads.py)
        self.stamp = np.zeros(n, np.int64)  # scratch for lease-membership guards
        self.stamp_clock = 0
        self.vdrop = np.zeros(n, np.int32)  # scratch of the eviction planner: references it would drop
        self.generation = 0  # moves on every change of a code, a version or the index (hits matched before are checked)
        self.runs: tuple[Index, list[tuple[PoolSlots, Index]]] | None = None  # a step's objects split by pool
        self.seen: set[tuple[str, str]] | None = None  # (kind, event) of every step taken, when a checker observes
        for lane in lanes:
            for event in fired[lane.index]:
                tables[lane.kind].event_id(event)  # SpecError now when the spec lacks an event fired on it
        self.masks: dict[frozenset[str], NDArray[np.bool_]] = {}  # codes_in's answers
        self.rules = {e: self.codes.rule(e) for e in {e for events in fired.values() for e in events}}
        self.published = self.codes_in(State.PUBLISHED)
        self.retired = self.codes_in(State.RETIRED)
        self.reserved = self.codes_in(State.RESERVED)
        self.filling = self.codes_in(State.FILLING)
        self.ahead = self.codes_in(State.AHEAD)

    def codes_in(self, *states: str) -> NDArray[np.bool_]:
        """Per code: is its state one of `states` (read-only; computed once per set of states)."""
        key = frozenset(states)
        mask = self.masks.get(key)
        if mask is None:
            mask = np.array([self.codes.describe(c)[1] in key for c in range(self.codes.size)], np.bool_)
            mask.flags.writeable = False
            self.masks[key] = mask
        return mask

    def state_name(self, obj: int | np.integer[Any]) -> str:
        return self.codes.describe(int(self.code[obj]))[1]

    # ------------------------------------------------------------------ steps

    def step(self, objs: Index, event: Event, actor: int = NO_OWNER, counts: Index | None = None) -> None:
        """Move every object of `objs` (distinct) by `event`; all or nothing (IllegalTransition changes nothing).

        `counts` (one per object) scales the counting effects (index references).
        """
        if not objs.size:
            return
        rule = self.rules[event]
        codes = self.code[objs].astype(np.intp)  # intp: gathers by a uint8 index array cost 5x more
        if not all_true(rule.legal[codes]):
            raise self._illegal(objs, codes, rule, None, actor)
        variant = rule.single
        if variant is None:
            kinds = rule.variant[codes]
            if any_true(kinds != kinds[0]):
                self._step_groups(objs, codes, rule, actor, counts)
                self.runs = None
                if self.seen is not None:
                    self.note(codes, event)
                return
            variant = rule.variants[int(kinds[0])]
        if variant.guards:
            refused = first_refusing(variant.guards, variant.guard_names, ObjectView(self, objs, actor))
            if refused is not None:
                raise self._illegal(objs, codes, rule, refused, actor)
        for effect in variant.run:
            effect(self, objs, actor, counts)
        if not variant.self_loop:
            self.generation += 1
            self.code[objs] = rule.dest[codes]
            if variant.to_initial:
                self._free_ids(objs)
        self.runs = None
        if self.seen is not None:
            self.note(codes, event)

    def note(self, codes: Index, event: Event) -> None:
        """Record (kind, event) for the kinds of `codes` in `seen` (coverage of a model check)."""
        assert self.seen is not None
        for k in np.unique(self.codes.kind_of[codes]).tolist():
            self.seen.add((self.codes.kinds[k], event.value))

    def _step_groups(self, objs: Index, codes: Index, rule: EventRule, actor: int,
                     counts: Index | None) -> None:
        """The fallback: one guard evaluation per distinct code, then the effects of each group."""
        groups = [(c, codes == c) for c in np.flatnonzero(np.bincount(codes)).tolist()]
        for c, mask in groups:
            edge = rule.edges[c]
            assert edge is not None
            refused = first_refusing(edge.guards, edge.guard_names, ObjectView(self, objs[mask], actor))
            if refused is not None:
                raise self._illegal(objs[mask], codes[mask], rule, refused, actor)
        for c, mask in groups:
            part = objs[mask]
            for effect in rule.runs[c]:
                effect(self, part, actor, None if counts is None else counts[mask])
            dest = int(rule.dest[c])
            self.generation += 1
            if dest != c:
                self.code[part] = dest
                if self.codes.initial[dest]:
                    self._free_ids(part)

    def _illegal(self, objs: Index, codes: Index, rule: EventRule, guard: str | None,
                 actor: int) -> IllegalTransition:
        """IllegalTransition naming the kind and state of the first object the event cannot move."""
        where = 0
        if guard is None:
            where = int(np.flatnonzero(rule.dest[codes] < 0)[0])
        else:
            edge = rule.edges[int(codes[0])]
            assert edge is not None
            check = edge.guards[edge.guard_names.index(guard)]
            verdict = np.broadcast_to(np.asarray(check(ObjectView(self, objs, actor)), np.bool_), objs.shape)
            refused = np.flatnonzero(~verdict)
            where = int(refused[0]) if refused.size else 0
        kind, state = self.codes.describe(int(codes[where]))
        return IllegalTransition(kind=kind, state=state, event=rule.event.value, guard=guard)

    def _free_ids(self, objs: Index) -> None:
        """Objects that became absent: their ids go back to their pools' free stacks."""
        for pool, part in self.by_pool(objs):
            pool.push_objects(part)

    def by_pool(self, objs: Index) -> list[tuple[PoolSlots, Index]]:
        """`objs` split into runs of one pool each (callers list objects pool by pool, so runs are few);
        the split of a step's objects is made once and shared by its effects."""
        if self.runs is not None and self.runs[0] is objs:
            return self.runs[1]
        pools = self.pool[objs]
        if pools[0] == pools[-1] and (objs.size < 3 or not any_true(pools[1:] != pools[:-1])):
            runs = [(self.pools[int(pools[0])], objs)]  # one pool (the usual case)
        else:
            cuts = (pools[1:] != pools[:-1]).nonzero()[0]
            edges = [0, *(cuts + 1).tolist(), objs.size]
            runs = [(self.pools[int(pools[a])], objs[a:b]) for a, b in zip(edges, edges[1:], strict=False)]
        self.runs = (objs, runs)
        return runs

    def reserve(self, demands: list[tuple[int, NDArray[np.int64], NDArray[np.int64]]], actor: int,
                event: Event = Event.RESERVE, known: int | None = None) -> list[Index]:
        """Per pool (count, row tokens, full tokens): that many FREE objects owned by `actor`, each placed in
        a free page (guard slot_available reads the pools' free pages; IllegalTransition, nothing taken);
        `event` RESERVE (RESERVED objects) or RESERVE_DRAFT (DRAFT objects of a speculative step).  With
        `known` (the owner's known tokens), a RESERVE takes objects whose first row needs a later token by
        RESERVE_AHEAD (AHEAD until `verify`; a working tail, which no commit completes, never is)."""
        parts, taken = [EMPTY] * len(self.pools), []
        for pool, (n, rows, fulls) in zip(self.pools, demands, strict=True):
            if n:
                top = pool.free_object_count
                if top < n:  # fewer FREE objects than pages wanted: the pages cannot be free either
                    table = self.codes.tables[self.codes.kinds.index(pool.spec.kind)]
                    raise IllegalTransition(kind=table.kind, state=table.states[table.initial],
                                            event=event.value, guard="slot_available")
                taken.append((pool, n, pool.free_objects[top - n:top][::-1], rows, fulls))
        if not taken:
            return parts
        objs = np.concatenate([t[2] for t in taken], dtype=np.intp)  # (one pool: a copy, as astype would make)
        edges = list(itertools.accumulate((t[1] for t in taken), initial=0))
        runs = []
        for (pool, *_), a, b in zip(taken, edges, edges[1:], strict=False):
            parts[pool.index] = part = objs[a:b]
            runs.append((pool, part))
        self.runs = (objs, runs)  # known already: no split by pool
        rows = np.concatenate([t[3] for t in taken])
        ahead = self._ahead(rows, known) if event == Event.RESERVE else None
        try:
            if ahead is None:
                self.step(objs, event, actor)
            else:  # make_room counted both parts: the second cannot be refused once the first passed
                self.step(objs[~ahead], event, actor)
                self.step(objs[ahead], Event.RESERVE_AHEAD, actor)
        finally:
            self.runs = None
        for pool, n, _, _, _ in taken:
            pool.free_object_count -= n
        self.row_token[objs] = rows
        self.full_token[objs] = np.concatenate([t[4] for t in taken])
        return parts

    @staticmethod
    def _ahead(rows: NDArray[np.int64], known: int | None) -> NDArray[np.bool_] | None:
        """Which reservations are ahead (first row past `known`, not a working tail); None when none is."""
        if known is None:
            return None
        ahead: NDArray[np.bool_] = (rows > known) & (rows != np.iinfo(np.int64).max)
        return ahead if any_true(ahead) else None

    def take_slots(self, objs: Index) -> None:
        """The take_slot effect: the lowest free pages of each object's pool become their placements."""
        for pool, part in self.by_pool(objs):
            assert part.size <= pool.free_slot_count, "guard slot_available precedes take_slot"
            pages = pool.pop_slots(part.size)  # (several pools of one shared space: the guard counted them all)
            self.slot[part] = pages
            pool.slot_object[pages] = part

    def free_placements(self, objs: Index) -> None:
        """The free_slot effect: the objects' pages go back to their pools' free stacks."""
        for pool, part in self.by_pool(objs):
            pages = self.slot[part]
            pool.slot_object[pages] = NULL_OBJECT
            pool.push_slots(pages)
        self.slot[objs] = NULL_OBJECT

    def bump(self, objs: Index) -> None:
        """The bump_version effect: fresh stamps, unique over the manager's life."""
        self.version[objs] = np.arange(self.clock, self.clock + objs.size, dtype=np.int64)
        self.clock += objs.size
        self.generation += 1

    # ------------------------------------------------------------------ compound uses

    def settle(self, objs: Index) -> None:
        """Distinct objects that just lost index references or pins: free what nobody holds or pins any more.

        PUBLISHED and unreferenced: evicted when unpinned, retired (when its
        kind retires) while a request still pins it; RETIRED and unpinned:
        reclaimed.
        """
        if not objs.size:
            return
        codes = self.code[objs].astype(np.intp)
        loose = (self.holders[objs] == 0) & self.published[codes]
        retired = self.retired[codes]
        if not any_true(loose | retired):
            return
        idle = (self.leases[objs] == 0) & (self.copies[objs] == 0)
        self.step(objs[loose & idle], Event.EVICT)
        held = objs[loose & ~idle]
        retiring = held[self.rules[Event.RETIRE].dest[self.code[held]] >= 0] if Event.RETIRE in self.rules else EMPTY
        self.step(retiring, Event.RETIRE)
        self.step(objs[retired & idle], Event.RECLAIM)

    def lease_mark(self, pinned: NDArray[np.integer], objs: NDArray[np.integer]) -> NDArray[np.bool_]:
        """Which of `objs` appear in `pinned` (one request's lease list): two scatters, no sort."""
        if not pinned.size:
            return np.zeros(objs.shape, np.bool_)
        self.stamp_clock += 1
        self.stamp[pinned] = self.stamp_clock
        found: NDArray[np.bool_] = self.stamp[objs] == self.stamp_clock
        return found

    def check_page(self, pool: int, page: int, version: int, actor: int = NO_OWNER,
                   writes: bool = False) -> tuple[bool, int, str]:
        """Is `page` of `pool` still the placement of an object at `version` that may be read (shared, or a
        RESERVED object `actor` owns: a request's plans may read its own working pages) - or, with `writes`,
        the FILLING target of `actor`'s load?"""
        slots = self.pools[pool].slot_object
        obj = int(slots[page]) if 0 <= page < len(slots) else NULL_OBJECT
        if obj == NULL_OBJECT:
            return False, -1, State.FREE.value
        found, code = int(self.version[obj]), int(self.code[obj])
        if writes:
            return found == version and self.owner[obj] == actor and bool(self.filling[code]), found, \
                self.codes.describe(code)[1]
        readable = bool(self.published[code] or self.retired[code]
                        or (actor != NO_OWNER and self.owner[obj] == actor and self.reserved[code]))
        return found == version and readable, found, self.codes.describe(code)[1]

    def clone(self, requests: RequestTable) -> PagePools:
        twin = object.__new__(PagePools)
        twin.__dict__.update(self.__dict__)
        for name, value in self.__dict__.items():
            if isinstance(value, np.ndarray):
                setattr(twin, name, value.copy())
        twin.spaces = tuple(space.clone() for space in self.spaces)
        shared = twin.spaces[0] if twin.spaces else None
        twin.pools = tuple(p.clone(shared) for p in self.pools)
        twin.requests = requests
        return twin

