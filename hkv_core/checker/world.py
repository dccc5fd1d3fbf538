"""The abstract world the model checker explores: segments, requests, a slot pool.

A world is an immutable tuple so it can be hashed and deduplicated:
`(segments, requests, free_slots_mask)`.  Each segment is a `Seg` tuple and
each request a `Req` tuple.  Per prefix p the world holds one segment of every
device kind, its tier load (a record copied into
that prefix's objects), a `block` (the prefix index entry of block p,
whose parent is block p - 1; block 0 is a root) and a `resume_point` at the
end of block p.  `Topology` says which prefix and kind each segment index has
and precomputes, from the spec, per-segment state masks (`mask[s][state]`) so
invariants and guards never compare state names on the hot path.

A `Move` is the mutable scratch copy one transition edits (segments as a list,
so an effect that reaches other segments - hold / drop references - edits the
same copy); `Move.freeze` turns it back into a World.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, Protocol

import attrs

from hkv_core.errors import InvalidArgument, SpecError
from hkv_core.spec.names import Event, State
from hkv_core.spec.records import KindSpec, LifecycleSpec
from hkv_core.spec.table import KindTable, compile_lifecycle

BLOCK_KIND = "block"  # the index kind whose entries chain (parent = the previous prefix's block)
POINT_KIND = "resume_point"  # the index kind whose entry sits on the block of its prefix

Mask = tuple[bool, ...]  # per state index of one kind: is the state in the set


class Seg(NamedTuple):
    """One segment: lifecycle state index and the bookkeeping the effects maintain."""

    state: int
    owner: int = -1  # request index owning a private segment, -1 for none
    rows: int = 0  # rows written (the content fingerprint)
    version: int = 0  # bumped whenever the slot's content identity ends
    leases: int = 0  # bitmask of requests holding a lease on it
    copy: int = 0  # 1 while an in-flight copy pins it
    slot: int = -1  # device slot, -1 when not device-resident
    frozen: int = -1  # rows at the moment the content was frozen
    holders: int = 0  # index entries holding a reference on this object
    refs: int = 0  # index entry: bit i set while it holds a reference on Topology.ref_targets[seg][i]
    cap: int = -1  # sealed size in rows; -1 means rows_per_segment (the canonical form of a full seal)
    row: int = 0  # index entry: 1 while it holds a row of its index table (rows are unbounded)
    unknown: int = 0  # 1 while it holds a position its owner does not know yet (set by mark_ahead)


class Req(NamedTuple):
    """One request: the prefix it holds a lease on (its chain ends at that block) and the versions it checked."""

    lease_prefix: int = -1
    lease_versions: tuple[int, ...] = ()


class World(NamedTuple):
    segs: tuple[Seg, ...]
    reqs: tuple[Req, ...]
    free_slots: int  # bitmask of free device slots


class WorldLike(Protocol):
    """What a guard view reads: a World, or a Move in progress."""

    @property
    def segs(self) -> Sequence[Seg]: ...
    @property
    def reqs(self) -> Sequence[Req]: ...
    @property
    def free_slots(self) -> int: ...


class Move:
    """A world under change by one transition: the mutable scratch copy its effects edit."""

    __slots__ = ("segs", "reqs", "free_slots")

    def __init__(self, world: World) -> None:
        self.segs: list[Seg] = list(world.segs)
        self.reqs: list[Req] = list(world.reqs)
        self.free_slots: int = world.free_slots

    def freeze(self) -> World:
        """The World this move produced."""
        return World(segs=tuple(self.segs), reqs=tuple(self.reqs), free_slots=self.free_slots)


# The largest bound `hkv check` accepts (its --help shows them as ranges; docs/cli.md says why).  A world is
# prefixes x 8 segments plus a record per request; each extra prefix or request multiplies the reachable worlds,
# and at 4 and 4 the state cap, not the depth, ends the search.  The slot mask is one int of `device_slots` bits.
# MAX_STATES bounds memory (about 0.9 KB a world with its BFS parent) and, since the search stops growing at
# the cap, the run time (about 45 us a world): 2,000,000 worlds are under 2 GB and about 90 s on one core.
# MAX_DEPTH only rejects nonsense: the state cap, not the depth, bounds the work.
MAX_PREFIXES = 4
MAX_REQUESTS = 4
MAX_DEVICE_SLOTS = 30
MAX_DEPTH = 64
MAX_STATES = 2_000_000


def within(action: str, name: str, value: int, low: int, high: int | None = None) -> None:
    """A bound's argument check: InvalidArgument(action, name, value) unless low <= value <= high."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(action=action, argument=name, value=value, reason="must be an int")
    if value < low or (high is not None and value > high):
        reason = f"must lie in [{low}, {high}]" if high is not None else f"must be at least {low}"
        raise InvalidArgument(action=action, argument=name, value=value, reason=reason)


@attrs.frozen(kw_only=True)
class CheckConfig:
    """The bound of a model check: how big the explored world is.

    `max_states` caps the worlds explored: at the cap the search stops growing (every world found is still
    checked) and the result says `truncated`.  `stop_on_violation` ends the search at the first world that
    breaks an invariant (its violations are the result's).  Out-of-range values raise `InvalidArgument`.
    """

    prefixes: int = 2
    requests: int = 3
    device_slots: int = 10  # two prefixes of every device kind (five) fit at once
    rows_per_segment: int = 1
    version_cap: int = 1
    max_depth: int = 3
    seeded_prefixes: int = 2
    max_states: int = MAX_STATES
    stop_on_violation: bool = False  # end the search at the first violating world (broken-variant tests)
    device_kinds: tuple[str, ...] = ()  # the device kinds each prefix holds (default: every kind of the spec)

    def __attrs_post_init__(self) -> None:
        within("CheckConfig", "prefixes", self.prefixes, 1, MAX_PREFIXES)
        within("CheckConfig", "requests", self.requests, 1, MAX_REQUESTS)
        within("CheckConfig", "device_slots", self.device_slots, 1, MAX_DEVICE_SLOTS)
        within("CheckConfig", "rows_per_segment", self.rows_per_segment, 1)  # not options: max_states bounds them
        within("CheckConfig", "version_cap", self.version_cap, 0)
        within("CheckConfig", "max_depth", self.max_depth, 0, MAX_DEPTH)
        within("CheckConfig", "seeded_prefixes", self.seeded_prefixes, 0, self.prefixes)
        within("CheckConfig", "max_states", self.max_states, 1, MAX_STATES)


def private_states(spec: LifecycleSpec, kind: KindSpec) -> frozenset[str]:
    """States in which an object belongs to one request.

    Those with an exit only its owner may take (guard `is_owner`), and the
    copy states a copy into such an object enters (a fill in flight keeps it
    private).  Derived from guards and copy states, not from the owner
    effects, so a spec that forgets `set_owner` / `clear_owner` is caught.
    """
    found = {t.source for t in kind.transitions if "is_owner" in t.guards}
    todo = list(found)
    while todo:
        state = todo.pop()
        for t in kind.transitions:
            if t.source == state and t.dest in spec.copy_states and t.dest not in found:
                found.add(t.dest)
                todo.append(t.dest)
    return frozenset(found)


def _spec_fail(spec: LifecycleSpec, message: str) -> SpecError:
    return SpecError(message, file=spec.source, table="meta", key="index_kinds")


class Topology:
    """Static facts about the world: which segment is which, and spec-derived state masks."""

    def __init__(self, spec: LifecycleSpec, config: CheckConfig) -> None:
        self.spec, self.config = spec, config
        self.tables: dict[str, KindTable] = compile_lifecycle(spec)
        for needed in (BLOCK_KIND, POINT_KIND):
            if needed not in spec.index_kinds:
                raise _spec_fail(spec, f"the checker's world needs index kind {needed!r}")
        device = config.device_kinds or spec.device_kinds
        unknown = sorted(set(device) - set(spec.device_kinds))
        if unknown or len(set(device)) != len(device):
            raise InvalidArgument(action="CheckConfig", argument="device_kinds", value=list(device),
                                  reason="must name distinct device kinds of the spec "
                                         f"({', '.join(spec.device_kinds)})")
        self.device_kinds = tuple(k for k in spec.device_kinds if k in device)
        kinds = list(self.device_kinds) + list(spec.record_kinds) + list(spec.index_kinds)
        self.seg_prefix = tuple(p for p in range(config.prefixes) for _ in kinds)
        self.seg_kind = tuple(k for _ in range(config.prefixes) for k in kinds)
        self.seg_table = tuple(self.tables[k] for k in self.seg_kind)
        self.is_device = tuple(k in self.device_kinds for k in self.seg_kind)
        self.is_index = tuple(k in spec.index_kinds for k in self.seg_kind)
        self.snapshot = tuple(k in spec.snapshot_kinds for k in self.seg_kind)
        self.all_segs = tuple(range(len(self.seg_kind)))
        self.device_segs = tuple(s for s in self.all_segs if self.is_device[s])
        self.index_segs = tuple(s for s in self.all_segs if self.is_index[s])
        self.device_of_prefix = tuple(tuple(s for s in self.device_segs if self.seg_prefix[s] == p)
                                      for p in range(config.prefixes))
        self.load_of_prefix = self._one_per_prefix(spec.record_kinds[0])
        self.block_of_prefix = self._one_per_prefix(BLOCK_KIND)
        self.point_of_prefix = self._one_per_prefix(POINT_KIND)
        self.ref_targets = tuple(self._ref_targets(s) for s in self.all_segs)
        self._masks(spec)
        self._events(spec)

    def _one_per_prefix(self, kind: str) -> tuple[int, ...]:
        return tuple(next(s for s in self.all_segs if self.seg_prefix[s] == p and self.seg_kind[s] == kind)
                     for p in range(self.config.prefixes))

    def _ref_targets(self, s: int) -> tuple[int, ...]:
        """The segments index entry `s` may reference: its prefix's segments of the kinds [references] lists."""
        kinds = [k for k in self.spec.references.get(self.seg_kind[s], ()) if k in self.device_kinds]
        return tuple(next(t for t in self.device_of_prefix[self.seg_prefix[s]] if self.seg_kind[t] == k)
                     for k in kinds)

    def _masks(self, spec: LifecycleSpec) -> None:
        """Per-segment state masks for every state set the guards and invariants ask about."""
        self.resident = self._mask(lambda k: spec.device_resident_states)
        self.frozen = self._mask(lambda k: spec.frozen_states)
        self.copying = self._mask(lambda k: spec.copy_states)
        self.indexable = self._mask(lambda k: spec.indexable_states)
        self.loading = self._mask(lambda k: frozenset({State.LOADING}))
        self.filling = self._mask(lambda k: frozenset({State.FILLING}))
        self.draft = self._mask(lambda k: frozenset({State.DRAFT, State.DRAFT_FILLING}))
        self.ready = self._mask(lambda k: frozenset({State.READY}))
        self.ahead = self._mask(lambda k: frozenset({State.AHEAD}))
        self.dead = self._mask(lambda k: spec.kind(k).final | {spec.kind(k).initial})
        self.private = self._mask(lambda k: private_states(spec, spec.kind(k)))
        live = {BLOCK_KIND: frozenset({State.INDEXED}), POINT_KIND: frozenset({State.KEPT})}
        self.referencing = self._mask(lambda k: live.get(k, frozenset()))
        self.row_holding = self.referencing  # an entry holds its row exactly while it is in the index
        self.block_indexed = self.tables[BLOCK_KIND].state_id(State.INDEXED)
        self.point_kept = self.tables[POINT_KIND].state_id(State.KEPT)

    def _mask(self, names_of: Callable[[str], Iterable[str]]) -> tuple[Mask, ...]:
        """Per segment: the mask of its kind's states that are in `names_of(kind)`."""
        by_kind = {k: t.states_mask(frozenset(names_of(k))) for k, t in self.tables.items()}
        return tuple(by_kind[k] for k in self.seg_kind)

    def _events(self, spec: LifecycleSpec) -> None:
        """Lease events split by what their edges do (add or drop a lease); the reference events' ids."""
        def with_effect(effect: str) -> tuple[str, ...]:
            return tuple(sorted(e for e in spec.lease_events
                                if any(t.event == e and effect in t.effects
                                       for k in self.device_kinds for t in spec.kind(k).transitions)))
        self.acquiring_events = with_effect("add_lease")
        self.releasing_events = with_effect("drop_lease")
        self.leasable = self._mask(lambda k: frozenset(
            t.source for t in spec.kind(k).transitions if t.event in self.releasing_events))
        self.hold_event = tuple(t.event_index.get(Event.HOLD) for t in self.seg_table)
        self.unhold_event = tuple(t.event_index.get(Event.UNHOLD) for t in self.seg_table)

    def initial_world(self) -> World:
        segs = tuple(Seg(state=t.initial) for t in self.seg_table)
        reqs = tuple(Req() for _ in range(self.config.requests))
        return World(segs=segs, reqs=reqs, free_slots=(1 << self.config.device_slots) - 1)

    def cap(self, seg: Seg) -> int:
        """The rows a segment holds when full: its sealed size, else rows_per_segment."""
        return seg.cap if seg.cap >= 0 else self.config.rows_per_segment

    def state_name(self, world: WorldLike, s: int) -> str:
        return self.seg_table[s].states[world.segs[s].state]

    def describe(self, seg: int) -> str:
        return f"p{self.seg_prefix[seg]}.{self.seg_kind[seg]}"
