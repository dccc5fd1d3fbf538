"""The abstract world the model checker explores: segments, requests, a slot pool.

A world is an immutable tuple so it can be hashed and deduplicated:
`(segments, requests, free_slots_mask)`.  Each segment is a `Seg` tuple and
each request a `Req` tuple; `Topology` says which prefix and kind each
segment index has and precomputes per-kind state-index sets from the spec.
"""

from __future__ import annotations

from typing import NamedTuple

import attrs

from hkv_core.spec.records import LifecycleSpec
from hkv_core.spec.table import KindTable, compile_lifecycle

DURABLE_RECORD_STATES = ("DURABLE", "READING")
READABLE_SOURCE_STATES = ("PUBLISHED", "ON_HOST")
DISK_HELD_STATES = ("ON_DISK", "LOADING")  # a LOADING segment may be reading the record
RECORD_PRESENT_STATES = ("DURABLE", "READING", "CORRUPT")
CORRUPT_STATE = "CORRUPT"


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
    quarantined: int = 0  # 1 once a checksum mismatch quarantined the record


class Req(NamedTuple):
    """One request: the prefix it holds a lease on and the versions it checked."""

    lease_prefix: int = -1
    lease_versions: tuple[int, ...] = ()


class World(NamedTuple):
    segs: tuple[Seg, ...]
    reqs: tuple[Req, ...]
    free_slots: int  # bitmask of free device slots


@attrs.frozen(kw_only=True)
class CheckConfig:
    """The bound of a model check: how big the explored world is."""

    prefixes: int = 2
    requests: int = 3
    device_slots: int = 6
    rows_per_segment: int = 1
    version_cap: int = 1
    max_depth: int = 3
    seeded_prefixes: int = 1
    max_states: int = 2_000_000

    def __attrs_post_init__(self) -> None:
        assert 1 <= self.prefixes <= 4 and 1 <= self.requests <= 4, "keep the bound small"
        assert 1 <= self.device_slots <= 30 and self.rows_per_segment >= 1
        assert self.version_cap >= 0 and self.max_states > 0 and self.max_depth >= 0
        assert 0 <= self.seeded_prefixes <= self.prefixes


class Topology:
    """Static facts about the world: which segment is which, and spec-derived index sets."""

    def __init__(self, spec: LifecycleSpec, config: CheckConfig) -> None:
        self.spec, self.config = spec, config
        self.tables: dict[str, KindTable] = compile_lifecycle(spec)
        kinds = list(spec.device_kinds) + list(spec.record_kinds)
        self.seg_prefix = tuple(p for p in range(config.prefixes) for _ in kinds)
        self.seg_kind = tuple(k for _ in range(config.prefixes) for k in kinds)
        self.seg_table = tuple(self.tables[k] for k in self.seg_kind)
        self.is_device = tuple(k in spec.device_kinds for k in self.seg_kind)
        self.by_prefix = tuple(
            tuple(s for s in range(len(self.seg_kind)) if self.seg_prefix[s] == p)
            for p in range(config.prefixes))
        self.device_of_prefix = tuple(
            tuple(s for s in segs if self.is_device[s]) for segs in self.by_prefix)
        self.record_of_prefix = tuple(
            next(s for s in segs if not self.is_device[s]) for segs in self.by_prefix)
        self.resident = self._index_sets(spec.device_resident_states)
        self.frozen = self._index_sets(spec.frozen_states)
        self.copying = self._index_sets(spec.copy_states)
        self.durable = self._index_sets(frozenset(DURABLE_RECORD_STATES))
        self.readable = self._index_sets(frozenset(READABLE_SOURCE_STATES))
        self.on_disk = self._index_sets(frozenset({"ON_DISK"}))
        self.disk_held = self._index_sets(frozenset(DISK_HELD_STATES))
        self.record_present = self._index_sets(frozenset(RECORD_PRESENT_STATES))
        self.corrupt = self._index_sets(frozenset({CORRUPT_STATE}))
        self.dead = {k: frozenset({t.initial} | {t.state_index[f] for f in spec.kind(k).final})
                     for k, t in self.tables.items()}
        self.leasable = self._event_sources("unpin")
        self.private = self._guard_sources("is_owner")

    def _index_sets(self, names: frozenset[str]) -> dict[str, frozenset[int]]:
        return {k: frozenset(i for i, s in enumerate(t.states) if s in names)
                for k, t in self.tables.items()}

    def _event_sources(self, event: str) -> dict[str, frozenset[int]]:
        return {k: frozenset(t.state_index[e.source] for e in self.spec.kind(k).transitions
                             if e.event == event) for k, t in self.tables.items()}

    def _guard_sources(self, guard: str) -> dict[str, frozenset[int]]:
        return {k: frozenset(t.state_index[e.source] for e in self.spec.kind(k).transitions
                             if guard in e.guards) for k, t in self.tables.items()}

    def initial_world(self) -> World:
        segs = tuple(Seg(state=t.initial) for t in self.seg_table)
        reqs = tuple(Req() for _ in range(self.config.requests))
        return World(segs=segs, reqs=reqs, free_slots=(1 << self.config.device_slots) - 1)

    def describe(self, seg: int) -> str:
        return f"p{self.seg_prefix[seg]}.{self.seg_kind[seg]}"
