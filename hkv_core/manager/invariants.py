"""check_invariants(manager): every spec invariant, evaluated on the live structures.

Each function returns a list of messages (empty when the invariant holds).
They are plain functions, not asserts, so `python -O` never strips them;
tests, the implementation-level model check and `ManagerConfig(debug_checks=True)`
call them.  What a request needs at its position is asked of the roles
(`Role.audit`), never decided here by role.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.core import Core
from hkv_core.manager.index import NO_BLOCK, NO_POINT
from hkv_core.manager.page_pool import NO_OWNER, NULL_OBJECT, PagePool
from hkv_core.manager.roles.base import NEVER_FULL
from hkv_core.spec.names import State


class HasCore(Protocol):
    """A CacheManager, or anything else that exposes the manager state it wraps."""

    @property
    def core(self) -> Core: ...


Check = Callable[[Core], list[str]]
PRIVATE = frozenset({State.RESERVED, State.FILLING, State.DRAFT, State.READY})


def _mask(pool: PagePool, names: frozenset[str]) -> NDArray[np.bool_]:
    """Per object: is its state one of `names`."""
    return np.asarray(np.array(pool.table.states_mask(names), np.bool_)[pool.state])


def _live_rows(table_state: NDArray[np.uint8], initial: int) -> NDArray[np.intp]:
    return np.flatnonzero(table_state != initial)


def copy_endpoints_pinned(core: Core) -> list[str]:
    out = []
    filling = {p.spec.index: set[int]() for p in core.pools}
    for record in core.plans.values():
        for lane, objs in record.fills:
            filling[lane].update(objs.tolist())
    for pool in core.pools:
        copying = _mask(pool, core.spec.copy_states)
        bad = np.flatnonzero(copying != (pool.copies > 0))
        out += [f"{pool.name} object {o}: copy pins {pool.copies[o]} in {pool.state_name(int(o))}" for o in bad]
        if set(np.flatnonzero(copying).tolist()) != filling[pool.spec.index]:
            out.append(f"{pool.name}: copy-pinned objects are not the targets of the plans in flight")
    return out


def pinned_never_freed(core: Core) -> list[str]:
    out = []
    for pool in core.pools:
        pinned = (pool.leases > 0) | (pool.copies > 0)
        bad = np.flatnonzero(pinned & ((pool.state == pool.s_free) | (pool.slot == NULL_OBJECT)))
        out += [f"{pool.name} object {o} is pinned but {pool.state_name(int(o))} or without a page" for o in bad]
    return out


def lease_versions_current(core: Core) -> list[str]:
    out = []
    for req in core.requests.live():
        for pool, pins in zip(core.pools, req.pins, strict=True):
            objs, versions = pins.objs.view(), pins.versions.view()
            moved = np.flatnonzero(pool.version[objs] != versions)
            out += [f"request {req.rid}: {pool.name} object {objs[i]} version moved {versions[i]} -> "
                    f"{pool.version[objs[i]]}" for i in moved]
    return out


def lease_covers_object_set(core: Core) -> list[str]:
    """Every object a request reads is its own or pinned by it, and it holds what its position needs."""
    out = []
    for req in core.requests.live():
        for pool in core.pools:
            objs = req.tables[pool.spec.index].view()
            objs = objs[objs != NULL_OBJECT]
            pinned = pool.lease_mark(req.pins[pool.spec.index].objs.view(), objs.astype(np.intp))
            bad = objs[(pool.owner[objs] != req.slot) & ~pinned]
            out += [f"request {req.rid} reads {pool.name} object {o} without owning or pinning it" for o in bad]
        for role in core.roles:
            out += role.audit(req)
    return out


def draft_isolation(core: Core) -> list[str]:
    out = []
    for pool in core.pools:
        drafts = _mask(pool, frozenset({State.DRAFT}))
        bad = np.flatnonzero(drafts & ((pool.holders > 0) | (pool.leases > 0) | (pool.owner < 0)))
        out += [f"{pool.name} DRAFT object {o} is indexed, pinned or ownerless" for o in bad]
    return out


def publish_only_when_complete(core: Core) -> list[str]:
    """READY objects hold every row (their owner committed past them); shared ones were sized and complete."""
    out = []
    for pool in core.pools:
        ready = np.flatnonzero(pool.state == pool.s_ready)
        short = ready[core.requests.committed[pool.owner[ready]] < pool.full_token[ready]]
        out += [f"{pool.name} object {o} is READY before its rows were written" for o in short]
        shared = np.flatnonzero(_mask(pool, frozenset({State.PUBLISHED, State.RETIRED})))
        odd = shared[(pool.full_token[shared] == NEVER_FULL) | (pool.full_token[shared] < pool.row_token[shared])]
        out += [f"{pool.name} object {o} is shared without a single complete row" for o in odd]
    return out


def immutable_when_frozen(core: Core) -> list[str]:
    """No request owns (and so may write) an object whose content is frozen."""
    out = []
    for pool in core.pools:
        frozen = _mask(pool, core.spec.frozen_states) & (pool.owner != NO_OWNER)
        out += [f"{pool.name} object {o} is {pool.state_name(int(o))} yet owned by slot {pool.owner[o]}"
                for o in np.flatnonzero(frozen)]
    return out


def slot_single_owner(core: Core) -> list[str]:
    """Placements are one-to-one; private objects have exactly one live owner that lists them."""
    out = []
    for pool in core.pools:
        placed = np.flatnonzero(pool.slot != NULL_OBJECT)
        if np.unique(pool.slot[placed]).size != placed.size or np.any(pool.slot_object[pool.slot[placed]] != placed):
            out.append(f"{pool.name}: a page holds two objects, or page and object disagree")
        private = _mask(pool, PRIVATE)
        if np.any(private != (pool.owner != NO_OWNER)):
            out.append(f"{pool.name}: an object's owner does not match its (private) state")
        owners = pool.owner[pool.owner != NO_OWNER]
        if any(core.requests.by_slot[s] is None for s in np.unique(owners).tolist()):
            out.append(f"{pool.name}: an object is owned by a request that is gone")
        listed = Counter[int]()
        for req in core.requests.live():
            listed.update(_listed(core, pool, req))
        mine = np.flatnonzero(pool.owner != NO_OWNER).tolist()
        if any(listed[o] != 1 for o in mine) or len(listed) != len(mine):
            out.append(f"{pool.name}: owned objects and the objects requests list disagree")
    return out


def _listed(core: Core, pool: PagePool, req: object) -> list[int]:
    """The objects of `pool` a request owns, found through its tables and pending snapshots."""
    from hkv_core.manager.requests import RequestState

    assert isinstance(req, RequestState)
    objs = req.tables[pool.spec.index].view()
    found = set(objs[(objs != NULL_OBJECT) & (pool.owner[objs] == req.slot)].tolist())
    for snaps in req.snapshots.values():
        found.update(int(o) for o in snaps if pool.owner[o] == req.slot)
    return list(found)


def no_slot_leak(core: Core) -> list[str]:
    out = _rows_accounted(core) + _lru_order(core)
    for pool in core.pools:
        n = len(pool.state)
        free_slots = pool.free_slots[:pool.free_slot_count]
        free_objs = pool.free_objects[:pool.free_object_count]
        held = np.zeros(n, np.bool_)
        held[pool.slot[pool.slot != NULL_OBJECT]] = True
        listed = np.zeros(n, np.bool_)
        listed[free_slots] = True
        if len(np.unique(free_slots)) != len(free_slots) or np.any(held & listed) or not np.all((held | listed)[1:]):
            out.append(f"{pool.name}: free pages and held pages do not partition the pool")
        absent = pool.state == pool.s_free
        absent[NULL_OBJECT] = False
        if set(free_objs.tolist()) != set(np.flatnonzero(absent).tolist()) or len(free_objs) != absent.sum():
            out.append(f"{pool.name}: the free object ids are not exactly the FREE objects")
        resident = _mask(pool, core.spec.device_resident_states)
        if np.any(resident[1:] != (pool.slot[1:] != NULL_OBJECT)):
            out.append(f"{pool.name}: an object holds a page exactly when it is device-resident - broken")
        stranded = ~absent & (pool.holders == 0) & (pool.leases == 0) & (pool.copies == 0) & (pool.owner < 0)
        stranded &= pool.state != pool.s_retired
        stranded[NULL_OBJECT] = False
        out += [f"{pool.name} object {o} leaked in {pool.state_name(int(o))}" for o in np.flatnonzero(stranded)]
    return out


def _rows_accounted(core: Core) -> list[str]:
    """Index rows: free rows and live entries partition each table; reservations match the requests'."""
    out = []
    for name, table in (("block", core.index.blocks), ("resume_point", core.index.points)):
        free = table.free_rows[:table.free_count]
        live = _live_rows(table.state, table.s_free)
        if len(np.unique(free)) != len(free) or set(free.tolist()) & set(live.tolist()) \
                or len(free) + len(live) != table.capacity:
            out.append(f"{name} rows: free rows and entries do not partition the table")
    reqs = core.requests.live()
    if core.index.blocks.reserved != sum(r.block_rows for r in reqs) or \
            core.index.points.reserved != sum(r.point_rows for r in reqs):
        out.append("index rows reserved do not match what requests in flight reserved")
    if core.index.keys.count != len(_live_rows(core.index.blocks.state, core.index.blocks.s_free)):
        out.append("the key table and the block table hold different numbers of blocks")
    return out


def _lru_order(core: Core) -> list[str]:
    """Every live block has a current eviction-order entry, after its children's (live chains aside)."""
    policy, blocks = core.index.policy, core.index.blocks
    order = getattr(policy, "order", None)
    if order is None:
        return []
    entries = order()
    live = _live_rows(blocks.state, blocks.s_free)
    if set(entries.tolist()) != set(live.tolist()) or len(entries) != len(live):
        return ["the eviction order and the indexed blocks differ"]
    place = np.full(blocks.capacity, -1, np.int64)
    place[entries] = np.arange(len(entries))
    on_chain = np.zeros(blocks.capacity, np.bool_)
    for req in core.requests.live():
        on_chain[req.chain.view()] = True
    child = live[blocks.parent[live] != NO_BLOCK]
    parent = blocks.parent[child]
    late = child[~on_chain[parent] & (place[child] > place[parent])]
    return [f"block {b} comes after its parent {blocks.parent[b]} in the eviction order" for b in late.tolist()[:8]]


def refcount_matches_leases(core: Core) -> list[str]:
    out = []
    for pool in core.pools:
        pins = Counter[int]()
        for req in core.requests.live():
            pins.update(req.pins[pool.spec.index].objs.view().tolist())
        for obj in set(np.flatnonzero(pool.leases).tolist()) | set(pins):
            if pool.leases[obj] != pins[obj]:
                out.append(f"{pool.name} object {obj}: leases {pool.leases[obj]}, lease lists name it {pins[obj]}x")
    return out


def disk_copy_durable(core: Core) -> list[str]:
    """No disk tier yet: no object may claim to live on disk, and no record is durable."""
    out = []
    for pool in core.pools:
        bad = np.flatnonzero(_mask(pool, frozenset({State.ON_DISK})) | (pool.record != 0))
        out += [f"{pool.name} object {o} is ON_DISK or has a record without a disk tier" for o in bad]
    return out


def _references(core: Core) -> list[Counter[int]]:
    """Per page pool: how many live index entries (blocks, points) refer to each object."""
    refs = [Counter[int]() for _ in core.pools]
    for table in (core.index.blocks, core.index.points):
        live = _live_rows(table.state, table.s_free)
        for pool, column in table.refs:
            refs[pool.spec.index].update(column[live].ravel().tolist())
    for r in refs:
        r.pop(NULL_OBJECT, None)
    return refs


def references_counted(core: Core) -> list[str]:
    out = []
    for pool, refs in zip(core.pools, _references(core), strict=True):
        for obj in set(np.flatnonzero(pool.holders).tolist()) | set(refs):
            if pool.holders[obj] != refs[obj]:
                out.append(f"{pool.name} object {obj}: holders {pool.holders[obj]}, index entries {refs[obj]}")
    return out


def referenced_objects_indexable(core: Core) -> list[str]:
    out = []
    for pool, refs in zip(core.pools, _references(core), strict=True):
        ok = np.array(pool.table.states_mask(core.spec.indexable_states), np.bool_)
        out += [f"{pool.name} object {o} is referenced by the index in state {pool.state_name(o)}"
                for o in refs if not ok[pool.state[o]]]
    return out


def index_closed(core: Core) -> list[str]:
    blocks, points = core.index.blocks, core.index.points
    out = []
    live = _live_rows(blocks.state, blocks.s_free)
    parents = blocks.parent[live]
    orphans = live[(parents != NO_BLOCK) & (blocks.state[np.maximum(parents, 0)] != blocks.s_indexed)]
    out += [f"block {b}'s parent {blocks.parent[b]} is not indexed" for b in orphans.tolist()[:8]]
    children = np.bincount(parents[parents != NO_BLOCK], minlength=blocks.capacity)
    if np.any(children[live] != blocks.children[live]):
        out.append("a block's child count differs from its indexed children")
    kept = _live_rows(points.state, points.s_free)
    where = points.block[kept]
    bad = kept[(blocks.state[where] != blocks.s_indexed) | (blocks.point[where] != kept)]
    out += [f"resume point {p} sits on block {points.block[p]}, which is not indexed or not its block"
            for p in bad.tolist()[:8]]
    pointed = live[blocks.point[live] != NO_POINT]
    if np.any(points.state[blocks.point[pointed]] == points.s_free):
        out.append("a block names a resume point that is not kept")
    return out


def live_chains_indexed(core: Core) -> list[str]:
    blocks, out = core.index.blocks, []
    for req in core.requests.live():
        chain = req.chain.view()
        ok = (blocks.state[chain] == blocks.s_indexed) & np.all(blocks.key[chain] == req.keys[:len(chain)], axis=1)
        if not np.all(ok):
            out.append(f"request {req.rid}: chain blocks {chain[~ok].tolist()[:8]} are not indexed under its keys")
    return out


INVARIANTS: Mapping[str, Check] = MappingProxyType({
    f.__name__: f for f in (copy_endpoints_pinned, pinned_never_freed, lease_versions_current,
                            lease_covers_object_set, draft_isolation, publish_only_when_complete,
                            immutable_when_frozen, slot_single_owner, no_slot_leak, refcount_matches_leases,
                            disk_copy_durable, references_counted, referenced_objects_indexable, index_closed,
                            live_chains_indexed)})


def check_invariants(manager: HasCore | Core) -> list[str]:
    """Every violated invariant of the spec on the live manager, as messages ('name: detail')."""
    core = manager if isinstance(manager, Core) else manager.core
    return [f"{inv.name}: {msg}" for inv in core.spec.invariants for msg in INVARIANTS[inv.name](core)]
