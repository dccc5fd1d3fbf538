"""The checker's implementation of every invariant named in the spec.

Each takes `(topo, world)` and returns None when it holds, else a message
naming the offending segment or request.  Invariants are plain functions, not
`assert`s, so `python -O` cannot strip them.  State sets come from the spec as
per-segment masks (`topo.frozen[s][state]`), never state-name comparisons.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from types import MappingProxyType

from hkv_core.checker.world import POINT_KIND, Topology, World

Invariant = Callable[[Topology, World], str | None]


def _copy_endpoints_pinned(topo: Topology, world: World) -> str | None:
    for s, seg in enumerate(world.segs):
        if topo.copying[s][seg.state] != (seg.copy == 1):
            return f"{_at(topo, world, s)} has copy pin {seg.copy}"
    return None


def _pinned_never_freed(topo: Topology, world: World) -> str | None:
    for s, seg in enumerate(world.segs):
        pinned = seg.leases != 0 or seg.copy == 1
        if pinned and topo.dead[s][seg.state]:
            return f"{_at(topo, world, s)} is pinned"
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
            if not seg.leases >> r & 1 or not topo.leasable[s][seg.state]:
                return f"request {r}'s lease misses {_at(topo, world, s)}"
    return None


def _draft_isolation(topo: Topology, world: World) -> str | None:
    for s in topo.device_segs:
        seg = world.segs[s]
        if topo.draft[s][seg.state] and (seg.owner < 0 or seg.leases or seg.frozen >= 0 or seg.holders):
            return f"{topo.describe(s)} is a DRAFT that is leased, frozen, referenced or ownerless"
    return None


def _ahead_never_published(topo: Topology, world: World) -> str | None:
    """An AHEAD segment, or one still holding a position its owner does not know, is private and unshared; a
    segment holding an unknown position is AHEAD (only `verify`, once known, leaves it)."""
    for s in topo.device_segs:
        seg = world.segs[s]
        ahead = topo.ahead[s][seg.state]
        if (ahead or seg.unknown) and (seg.owner < 0 or seg.leases or seg.copy or seg.frozen >= 0 or seg.holders):
            return f"{_at(topo, world, s)} holds unknown positions yet is shared, pinned, frozen or ownerless"
        if seg.unknown and not ahead:
            return f"{_at(topo, world, s)} left AHEAD before its owner knew its tokens"
    return None


def _publish_only_when_complete(topo: Topology, world: World) -> str | None:
    for s in topo.device_segs:
        seg = world.segs[s]
        shareable = topo.frozen[s][seg.state] or topo.ready[s][seg.state]
        if shareable and seg.rows != topo.cap(seg):
            return f"{_at(topo, world, s)} with {seg.rows}/{topo.cap(seg)} rows"
    return None


def _immutable_when_frozen(topo: Topology, world: World) -> str | None:
    for s in topo.device_segs:
        seg = world.segs[s]
        if topo.frozen[s][seg.state] and seg.frozen != seg.rows:
            return f"{topo.describe(s)} changed after freezing: {seg.frozen} -> {seg.rows} rows"
    return None


def _slot_single_owner(topo: Topology, world: World) -> str | None:
    holders: dict[int, int] = {}
    for s, seg in enumerate(world.segs):
        if seg.slot >= 0 and holders.setdefault(seg.slot, s) != s:
            return f"slot {seg.slot} held by {topo.describe(holders[seg.slot])} and {topo.describe(s)}"
        if topo.private[s][seg.state] != (seg.owner >= 0):
            return f"{_at(topo, world, s)} has owner {seg.owner}"
    return None


def _no_slot_leak(topo: Topology, world: World) -> str | None:
    """Device slots partition into free and held; index rows are held exactly in the row-holding states."""
    held = 0
    for s, seg in enumerate(world.segs):
        if (topo.is_device[s] and topo.resident[s][seg.state]) != (seg.slot >= 0):
            return f"{_at(topo, world, s)} holds slot {seg.slot}"
        if topo.row_holding[s][seg.state] != (seg.row == 1):
            return f"{_at(topo, world, s)} holds {seg.row} index rows"
        held |= (1 << seg.slot) if seg.slot >= 0 else 0
    every = (1 << topo.config.device_slots) - 1
    if held & world.free_slots or (held | world.free_slots) != every:
        return f"slots leaked or double-listed: held {held:b}, free {world.free_slots:b}"
    return None


def _blocks_exclusive(topo: Topology, world: World) -> str | None:
    """The world's device slots are one space every kind draws from: a slot is held by at most one segment,
    whatever its kind, and a held slot is never free."""
    holder: dict[int, int] = {}
    for s in topo.device_segs:
        slot = world.segs[s].slot
        if slot < 0:
            continue
        if slot in holder:
            return f"block {slot} held by {topo.describe(holder[slot])} and {topo.describe(s)} at once"
        if world.free_slots >> slot & 1:
            return f"block {slot} of {_at(topo, world, s)} is on the free list"
        holder[slot] = s
    return None


def _freed_blocks_unreachable(topo: Topology, world: World) -> str | None:
    """Every segment an index entry refers to, a lease pins or a copy pins holds a block that is not free and
    that no other segment holds."""
    holders = Counter(seg.slot for seg in world.segs if seg.slot >= 0)
    reached = {t for s in topo.index_segs for i, t in enumerate(topo.ref_targets[s]) if world.segs[s].refs >> i & 1}
    reached |= {s for s in topo.device_segs if world.segs[s].leases or world.segs[s].copy}
    for s in sorted(reached):
        slot = world.segs[s].slot
        if slot < 0 or world.free_slots >> slot & 1 or holders[slot] > 1:
            return f"{_at(topo, world, s)} is reachable but its block {slot} was freed or handed on"
    return None


def _refcount_matches_leases(topo: Topology, world: World) -> str | None:
    by_prefix = [0] * topo.config.prefixes
    for r, req in enumerate(world.reqs):
        if req.lease_prefix >= 0:
            by_prefix[req.lease_prefix] |= 1 << r
    for s, seg in enumerate(world.segs):
        expected = by_prefix[topo.seg_prefix[s]] if topo.is_device[s] else 0
        if seg.leases != expected:
            return f"{topo.describe(s)} lease holders {seg.leases:b}, leases name {expected:b}"
    return None


def _tier_loads_pinned(topo: Topology, world: World) -> str | None:
    """A LOADING tier load's objects (its prefix's device kinds) are FILLING, copy-pinned, for one request."""
    for p in range(topo.config.prefixes):
        load = topo.load_of_prefix[p]
        if not topo.loading[load][world.segs[load].state]:
            continue
        owners = set()
        for s in topo.device_of_prefix[p]:
            seg = world.segs[s]
            if not topo.filling[s][seg.state] or seg.copy != 1:
                return f"{topo.describe(load)} is LOADING into {_at(topo, world, s)}"
            owners.add(seg.owner)
        if len(owners) != 1 or -1 in owners:
            return f"{topo.describe(load)} is LOADING into objects of requests {sorted(owners)}"
    return None


def _references_counted(topo: Topology, world: World) -> str | None:
    """Holders equal the referencing index entries whose bit covers the object; a released entry holds nothing."""
    expected = [0] * len(world.segs)
    for s in topo.index_segs:
        seg = world.segs[s]
        if not seg.refs:
            continue
        if not topo.referencing[s][seg.state]:
            return f"{_at(topo, world, s)} still holds references {seg.refs:b}"
        for i, t in enumerate(topo.ref_targets[s]):
            expected[t] += seg.refs >> i & 1
    for s, seg in enumerate(world.segs):
        if seg.holders != expected[s]:
            return f"{topo.describe(s)} has {seg.holders} holders, {expected[s]} index entries refer to it"
    return None


def _snapshots_unshared(topo: Topology, world: World) -> str | None:
    """A point snapshot (a kind only resume points refer to) has at most one holder, and never a block."""
    for s in topo.device_segs:
        seg = world.segs[s]
        if topo.snapshot[s] and seg.holders > 1:
            return f"{_at(topo, world, s)} is a point snapshot held by {seg.holders} index entries"
    for s in topo.index_segs:
        refs = world.segs[s].refs
        for i, t in enumerate(topo.ref_targets[s]):
            if refs >> i & 1 and topo.snapshot[t] and topo.seg_kind[s] != POINT_KIND:
                return f"{topo.describe(s)} refers to point snapshot {_at(topo, world, t)}"
    return None


def _referenced_objects_indexable(topo: Topology, world: World) -> str | None:
    for s in topo.index_segs:
        refs = world.segs[s].refs
        for i, t in enumerate(topo.ref_targets[s]):
            if refs >> i & 1 and not topo.indexable[t][world.segs[t].state]:
                return f"{topo.describe(s)} refers to {_at(topo, world, t)}"
    return None


def _index_closed(topo: Topology, world: World) -> str | None:
    segs = world.segs
    for p in range(topo.config.prefixes):
        block, point = topo.block_of_prefix[p], topo.point_of_prefix[p]
        indexed = segs[block].state == topo.block_indexed
        if segs[point].state == topo.point_kept and not indexed:
            return f"{topo.describe(point)} is KEPT but {_at(topo, world, block)}"
        if indexed and p > 0 and segs[topo.block_of_prefix[p - 1]].state != topo.block_indexed:
            return f"{topo.describe(block)} is INDEXED but its parent {_at(topo, world, topo.block_of_prefix[p - 1])}"
    return None


def _live_chains_indexed(topo: Topology, world: World) -> str | None:
    for r, req in enumerate(world.reqs):
        for p in range(req.lease_prefix + 1):
            block = topo.block_of_prefix[p]
            if world.segs[block].state != topo.block_indexed:
                return f"request {r}'s chain to p{req.lease_prefix} names {_at(topo, world, block)}"
    return None


def _at(topo: Topology, world: World, s: int) -> str:
    """A segment and its state, for messages."""
    return f"{topo.describe(s)} ({topo.state_name(world, s)})"


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
    "blocks_exclusive": _blocks_exclusive,
    "freed_blocks_unreachable": _freed_blocks_unreachable,
    "refcount_matches_leases": _refcount_matches_leases,
    "tier_loads_pinned": _tier_loads_pinned,
    "snapshots_unshared": _snapshots_unshared,
    "references_counted": _references_counted,
    "referenced_objects_indexable": _referenced_objects_indexable,
    "index_closed": _index_closed,
    "live_chains_indexed": _live_chains_indexed,
    "ahead_never_published": _ahead_never_published,
})
