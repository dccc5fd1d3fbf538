"""The checker's implementation of every invariant named in the spec.

Each takes `(topo, world)` and returns None when it holds, else a message
naming the offending segment or request.  Invariants are plain functions, not
`assert`s, so `python -O` cannot strip them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from hkv_core.checker.world import Topology, World

Invariant = Callable[[Topology, World], str | None]


def _copy_endpoints_pinned(topo: Topology, world: World) -> str | None:
    for s, seg in enumerate(world.segs):
        if (seg.state in topo.copying[topo.seg_kind[s]]) != (seg.copy == 1):
            return f"{topo.describe(s)} copy pin {seg.copy} in state {_state(topo, world, s)}"
    return None


def _pinned_never_freed(topo: Topology, world: World) -> str | None:
    for s, seg in enumerate(world.segs):
        pinned = seg.leases != 0 or seg.copy == 1
        if pinned and seg.state in topo.dead[topo.seg_kind[s]]:
            return f"{topo.describe(s)} is pinned but {_state(topo, world, s)}"
        if seg.leases and topo.is_device[s] and seg.slot < 0:
            return f"{topo.describe(s)} is leased but holds no device slot"
    return None


def _lease_versions_current(topo: Topology, world: World) -> str | None:
    for r, req in enumerate(world.reqs):
        if req.lease_prefix < 0:
            continue
        now = tuple(world.segs[s].version for s in topo.device_of_prefix[req.lease_prefix])
        if now != req.lease_versions:
            return f"request {r} holds a stale lease: checked {req.lease_versions}, now {now}"
    return None


def _lease_covers_object_set(topo: Topology, world: World) -> str | None:
    for r, req in enumerate(world.reqs):
        if req.lease_prefix < 0:
            continue
        for s in topo.device_of_prefix[req.lease_prefix]:
            seg = world.segs[s]
            if not seg.leases >> r & 1 or seg.state not in topo.leasable[topo.seg_kind[s]]:
                return f"request {r}'s lease misses {topo.describe(s)} ({_state(topo, world, s)})"
    return None


def _draft_isolation(topo: Topology, world: World) -> str | None:
    for s, seg in enumerate(world.segs):
        if _state(topo, world, s) == "DRAFT" and (seg.owner < 0 or seg.leases or seg.frozen >= 0):
            return f"{topo.describe(s)} is a DRAFT that is leased, frozen or ownerless"
    return None


def _publish_only_when_complete(topo: Topology, world: World) -> str | None:
    full = topo.config.rows_per_segment
    for s, seg in enumerate(world.segs):
        kind = topo.seg_kind[s]
        shareable = seg.state in topo.frozen[kind] or _state(topo, world, s) == "READY"
        if topo.is_device[s] and shareable and seg.rows != full:
            return f"{topo.describe(s)} is {_state(topo, world, s)} with {seg.rows}/{full} rows"
    return None


def _immutable_when_frozen(topo: Topology, world: World) -> str | None:
    for s, seg in enumerate(world.segs):
        if topo.is_device[s] and seg.state in topo.frozen[topo.seg_kind[s]] and seg.frozen != seg.rows:
            return f"{topo.describe(s)} changed after freezing: {seg.frozen} -> {seg.rows} rows"
    return None


def _slot_single_owner(topo: Topology, world: World) -> str | None:
    holders: dict[int, int] = {}
    for s, seg in enumerate(world.segs):
        if seg.slot >= 0 and holders.setdefault(seg.slot, s) != s:
            return f"slot {seg.slot} held by {topo.describe(holders[seg.slot])} and {topo.describe(s)}"
        private = seg.state in topo.private[topo.seg_kind[s]]
        if private != (seg.owner >= 0):
            return f"{topo.describe(s)} owner {seg.owner} in state {_state(topo, world, s)}"
    return None


def _no_slot_leak(topo: Topology, world: World) -> str | None:
    held = 0
    for s, seg in enumerate(world.segs):
        resident = seg.state in topo.resident[topo.seg_kind[s]]
        if topo.is_device[s] and resident != (seg.slot >= 0):
            return f"{topo.describe(s)} slot {seg.slot} in state {_state(topo, world, s)}"
        held |= (1 << seg.slot) if seg.slot >= 0 else 0
    every = (1 << topo.config.device_slots) - 1
    if held & world.free_slots or (held | world.free_slots) != every:
        return f"slots leaked or double-listed: held {held:b}, free {world.free_slots:b}"
    return None


def _refcount_matches_leases(topo: Topology, world: World) -> str | None:
    for s, seg in enumerate(world.segs):
        expected = sum(1 << r for r, req in enumerate(world.reqs)
                       if req.lease_prefix == topo.seg_prefix[s] and topo.is_device[s])
        if seg.leases != expected:
            return f"{topo.describe(s)} lease holders {seg.leases:b}, leases name {expected:b}"
    return None


def _disk_copy_durable(topo: Topology, world: World) -> str | None:
    for s, seg in enumerate(world.segs):
        kind = topo.seg_kind[s]
        if seg.state in topo.corrupt[kind] and not seg.quarantined:
            return f"{topo.describe(s)} is CORRUPT but not quarantined"
        if seg.state in topo.on_disk[kind]:
            record = world.segs[topo.record_of_prefix[topo.seg_prefix[s]]]
            rkind = topo.seg_kind[topo.record_of_prefix[topo.seg_prefix[s]]]
            if record.state not in topo.record_present[rkind]:
                return f"{topo.describe(s)} is ON_DISK but its disk record is gone"
    return None


def _state(topo: Topology, world: World, s: int) -> str:
    return topo.seg_table[s].states[world.segs[s].state]


INVARIANTS: Mapping[str, Invariant] = MappingProxyType({
    "copy_endpoints_pinned": _copy_endpoints_pinned,
    "pinned_never_freed": _pinned_never_freed,
    "lease_versions_current": _lease_versions_current,
    "lease_covers_object_set": _lease_covers_object_set,
    "draft_isolation": _draft_isolation,
    "publish_only_when_complete": _publish_only_when_complete,
    "immutable_when_frozen": _immutable_when_frozen,
    "slot_single_owner": _slot_single_owner,
    "no_slot_leak": _no_slot_leak,
    "refcount_matches_leases": _refcount_matches_leases,
    "disk_copy_durable": _disk_copy_durable,
})
