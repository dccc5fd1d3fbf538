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
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.core import Core
from hkv_core.manager.index import NO_BLOCK, NO_POINT
from hkv_core.manager.page_pools import NO_OWNER, NULL_OBJECT, PagePools, PoolSlots, SlotSpace
from hkv_core.manager.requests import RequestState
from hkv_core.manager.roles.base import NEVER_FULL
from hkv_core.spec.names import State


class HasCore(Protocol):
    """A CacheManager, or anything else that exposes the manager state it wraps."""

    @property
    def core(self) -> Core: ...


Check = Callable[[Core], list[str]]
PRIVATE = (State.AHEAD, State.RESERVED, State.FILLING, State.DRAFT, State.DRAFT_FILLING, State.READY)


def _in(o: PagePools, states: frozenset[str] | tuple[str, ...]) -> NDArray[np.bool_]:
    """Per object (NULL object excluded): is its state one of `states`."""
    mask: NDArray[np.bool_] = o.codes_in(*states)[o.code]  # a fresh array
    mask[NULL_OBJECT] = False
    return mask


def _name(o: PagePools, obj: int | np.integer[Any]) -> str:
    return f"{o.pools[int(o.pool[obj])].name} object {obj}"


def _live(state: NDArray[np.uint8], initial: int) -> NDArray[np.intp]:
    return np.flatnonzero(state != initial)


def copy_endpoints_pinned(core: Core) -> list[str]:
    o = core.objects
    copying = _in(o, tuple(core.spec.copy_states))
    out = [f"{_name(o, b)}: copy pins {o.copies[b]} in {o.state_name(b)}"
           for b in np.flatnonzero(copying != (o.copies > 0))]
    targets = set(t for record in core.plans.values() for t in record.fills.tolist())
    if set(np.flatnonzero(copying).tolist()) != targets:
        out.append("copy-pinned objects are not exactly the targets of the plans in flight")
    loads = core.loads
    out += [f"tier load {key[1]!r} of plan {key[0]}: copy pins {load.copies} in {loads.table.states[load.state]}"
            for key, load in loads.loads.items()
            if (loads.table.states[load.state] in core.spec.copy_states) != (load.copies > 0)]
    return out


def pinned_never_freed(core: Core) -> list[str]:
    o = core.objects
    pinned = (o.leases > 0) | (o.copies > 0)
    bad = np.flatnonzero(pinned & (_in(o, (State.FREE,)) | (o.slot == NULL_OBJECT)))
    return [f"{_name(o, b)} is pinned but {o.state_name(b)} or without a page" for b in bad]


def lease_versions_current(core: Core) -> list[str]:
    o, out = core.objects, []
    for req in core.requests.live():
        objs, versions = req.pins.objs, req.pins.versions
        moved = np.flatnonzero(o.version[objs] != versions)
        out += [f"request {req.rid}: {_name(o, int(objs[i]))} version moved {versions[i]} -> {o.version[objs[i]]}"
                for i in moved]
    return out


def lease_covers_object_set(core: Core) -> list[str]:
    """Every object a request reads is its own or pinned by it, and it holds what its position needs."""
    o, out = core.objects, []
    for req in core.requests.live():
        read = np.concatenate([t.view() for t in req.tables]) if req.tables else np.zeros(0, np.int32)
        read = read[read != NULL_OBJECT].astype(np.intp)
        pinned = o.lease_mark(req.pins.objs, read)
        bad = read[(o.owner[read] != req.slot) & ~pinned]
        out += [f"request {req.rid} reads {_name(o, b)} without owning or pinning it" for b in bad]
        out += [f"request {req.rid}'s {pool.name} page table disagrees with its objects' pages"
                for pool, table in zip(core.pools, req.tables, strict=True)
                if np.any(table.pages.view() != o.slot[table.view()])]
        for role in core.roles:
            out += role.audit(req)
    return out


def draft_isolation(core: Core) -> list[str]:
    """DRAFT objects are private to the step that reserved them (and exactly its objects), and nothing past a
    request's verified tokens has a key, a chained block or a pending point (docs/drafts.md)."""
    o = core.objects
    draft = _in(o, (State.DRAFT, State.DRAFT_FILLING))
    bad = np.flatnonzero(draft & ((o.holders > 0) | (o.leases > 0) | (o.owner < 0)))
    out = [f"{_name(o, b)} is a DRAFT that is indexed, pinned or ownerless" for b in bad]
    listed = set[int]()
    for req in core.requests.live():
        step = req.draft
        mine = step.objects(req.tables) if step is not None else []
        listed.update(mine)
        if any(not draft[b] or o.owner[b] != req.slot for b in mine):
            out.append(f"request {req.rid}: its speculative step lists an object that is not its DRAFT")
        out += _verified_only(core, req)
    if listed != set(np.flatnonzero(draft).tolist()):
        out.append("the DRAFT objects are not exactly those the speculative steps in flight list")
    return out


def _verified_only(core: Core, req: RequestState) -> list[str]:
    """Keys, chain and pending points of a request cover verified tokens only; a step starts at the verified
    watermark and at the committed one."""
    bt, out = core.block_tokens, []
    if len(req.keys) != len(req.tokens) // bt:
        out.append(f"request {req.rid}: {len(req.keys)} block keys over {len(req.tokens)} verified tokens")
    if len(req.chain) * bt > req.computed or any(p > req.allocated for p in req.pending_points):
        out.append(f"request {req.rid}: a chained block lies past its committed or a pending point past its "
                   f"allocated tokens")
    step = req.draft
    if step is not None and (step.verified != len(req.tokens) or step.start != req.computed):
        out.append(f"request {req.rid}: its step starts at {step.start} / verified {step.verified}, not at "
                   f"{req.computed} committed / {len(req.tokens)} verified")
    return out


def ahead_never_published(core: Core) -> list[str]:
    """AHEAD objects are private, unshared and still ahead of their owner's known tokens, exactly those the
    requests list; no request committed past its known tokens (docs/manager.md, "Slots reserved ahead")."""
    o = core.objects
    ahead = _in(o, (State.AHEAD,))
    objs = np.flatnonzero(ahead)
    owners = o.owner[objs]
    bad = objs[(owners < 0) | (o.leases[objs] > 0) | (o.holders[objs] > 0) | (o.copies[objs] > 0)
               | (core.requests.known[owners] >= o.row_token[objs])]
    out = [f"{_name(o, b)} is AHEAD but shared, ownerless or already known" for b in bad]
    listed = [b for req in core.requests.live() for b in req.ahead]
    if sorted(listed) != objs.tolist():
        out.append("the AHEAD objects are not exactly those the requests list as reserved ahead")
    for req in core.requests.live():
        if req.computed > len(req.tokens) or core.requests.known[req.slot] != len(req.tokens):
            out.append(f"request {req.rid} committed {req.computed} tokens, past its {len(req.tokens)} known "
                       f"(or the known watermark {core.requests.known[req.slot]} is stale)")
    return out


def publish_only_when_complete(core: Core) -> list[str]:
    """READY objects hold every row (their owner committed past them); shared ones were sized and complete."""
    o = core.objects
    ready = np.flatnonzero(_in(o, (State.READY,)))
    out = [f"{_name(o, b)} is READY before its rows were written"
           for b in ready[core.requests.committed[o.owner[ready]] < o.full_token[ready]]]
    shared = np.flatnonzero(_in(o, (State.PUBLISHED, State.RETIRED)))
    odd = shared[(o.full_token[shared] == NEVER_FULL) | (o.full_token[shared] < o.row_token[shared])]
    return out + [f"{_name(o, b)} is shared without a single complete row" for b in odd]


def immutable_when_frozen(core: Core) -> list[str]:
    """No request owns (and so may write) an object whose content is frozen."""
    o = core.objects
    frozen = _in(o, tuple(core.spec.frozen_states)) & (o.owner != NO_OWNER)
    return [f"{_name(o, b)} is {o.state_name(b)} yet owned by slot {o.owner[b]}" for b in np.flatnonzero(frozen)]


def slot_single_owner(core: Core) -> list[str]:
    """Placements are one-to-one; private objects have exactly one live owner that lists them."""
    o, out = core.objects, []
    placed = np.flatnonzero(o.slot != NULL_OBJECT)
    for pool in o.pools:
        mine = placed[o.pool[placed] == pool.index]
        if np.unique(o.slot[mine]).size != mine.size or np.any(pool.slot_object[o.slot[mine]] != mine):
            out.append(f"{pool.name}: a page holds two objects, or page and object disagree")
    if np.any(_in(o, PRIVATE) != (o.owner != NO_OWNER)):
        out.append("an object's owner does not match its (private) state")
    owners = o.owner[o.owner != NO_OWNER]
    if any(core.requests.by_slot[s] is None for s in np.unique(owners).tolist()):
        out.append("an object is owned by a request that is gone")
    listed = Counter[int]()
    for req in core.requests.live():
        listed.update(_listed(core, req))
    mine = np.flatnonzero(o.owner != NO_OWNER).tolist()
    if any(listed[b] != 1 for b in mine) or len(listed) != len(mine):
        out.append("owned objects and the objects requests list disagree")
    return out


def _listed(core: Core, req: RequestState) -> set[int]:
    """The objects a request owns, found through its tables and pending snapshots."""
    o, found = core.objects, set[int]()
    for table in req.tables:
        objs = table.view()
        found.update(objs[(objs != NULL_OBJECT) & (o.owner[objs] == req.slot)].tolist())
    for snaps in req.snapshots.values():
        found.update(b for b in snaps if o.owner[b] == req.slot)
    if req.draft is not None:
        found.update(req.draft.objects(req.tables))
    return found


def _spaces(core: Core) -> list[tuple[SlotSpace, tuple[PoolSlots, ...], str]]:
    """Each block space, the pools drawing from it, and its name for messages."""
    found: dict[int, tuple[SlotSpace, list[PoolSlots]]] = {}
    for pool in core.objects.pools:
        found.setdefault(id(pool.space), (pool.space, []))[1].append(pool)
    return [(space, tuple(pools), pools[0].name if len(pools) == 1 else "the shared block space")
            for space, pools in found.values()]


def _holders(space: SlotSpace, pools: tuple[PoolSlots, ...]) -> NDArray[np.int64]:
    """Per block of `space`: how many pools' page maps name an object there."""
    counts: NDArray[np.int64] = np.zeros(space.slots, np.int64)
    for pool in pools:
        counts += pool.slot_object != NULL_OBJECT
    counts[0] = 0  # the NULL page
    return counts


def blocks_exclusive(core: Core) -> list[str]:
    """In every block space a block is held by at most one pool's object, and a held block is never free."""
    out = []
    for space, pools, name in _spaces(core):
        held = _holders(space, pools)
        out += [f"{name}: block {b} is held by {held[b]} pools at once" for b in np.flatnonzero(held > 1)[:4]]
        free = space.free[:space.count]
        out += [f"{name}: block {b} is free and held" for b in free[held[free] > 0][:4].tolist()]
    return out


def freed_blocks_unreachable(core: Core) -> list[str]:
    """Every object the index refers to, a lease pins or a copy pins still holds its block: the block maps back
    to it in its own pool, no other pool holds it, and it is not free."""
    o, out = core.objects, []
    reached = np.flatnonzero((o.holders > 0) | (o.leases > 0) | (o.copies > 0))
    reached = reached[reached != NULL_OBJECT]
    for space, pools, _ in _spaces(core):
        held, free = _holders(space, pools), np.zeros(space.slots, np.bool_)
        free[space.free[:space.count]] = True
        for pool in pools:
            mine = reached[o.pool[reached] == pool.index]
            pages = o.slot[mine]
            lost = (pages == NULL_OBJECT) | (pool.slot_object[pages] != mine) | free[pages] | (held[pages] > 1)
            out += [f"{_name(o, b)} is reachable but its block {o.slot[b]} was freed or handed on"
                    for b in mine[lost][:4].tolist()]
    return out


def no_slot_leak(core: Core) -> list[str]:
    o = core.objects
    out = _rows_accounted(core) + _lru_order(core)
    absent = _in(o, (State.FREE,))
    for space, pools, name in _spaces(core):
        pages = space.free[:space.count]
        held = np.zeros(space.slots, np.bool_)
        for pool in pools:
            held[o.slot[(o.pool == pool.index) & (o.slot != NULL_OBJECT)]] = True
        listed = np.zeros(space.slots, np.bool_)
        listed[pages] = True
        if len(np.unique(pages)) != len(pages) or np.any(held & listed) or not np.all((held | listed)[1:]):
            out.append(f"{name}: free pages and held pages do not partition the pool")
    for pool in o.pools:
        ids = pool.free_objects[:pool.free_object_count]
        mine = np.flatnonzero(absent & (o.pool == pool.index))
        if len(ids) != len(mine) or set(ids.tolist()) != set(mine.tolist()):
            out.append(f"{pool.name}: the free object ids are not exactly its FREE objects")
    resident = _in(o, tuple(core.spec.device_resident_states))
    if np.any(resident[1:] != (o.slot[1:] != NULL_OBJECT)):
        out.append("an object holds a page exactly when it is device-resident - broken")
    stranded = ~absent & (o.holders == 0) & (o.leases == 0) & (o.copies == 0) & (o.owner < 0)
    stranded[NULL_OBJECT] = False
    return out + [f"{_name(o, b)} leaked in {o.state_name(b)}" for b in np.flatnonzero(stranded)]


def _rows_accounted(core: Core) -> list[str]:
    """Index rows: free rows and live entries partition each table; reservations match the requests'."""
    out = []
    for name, table in (("block", core.index.blocks), ("resume_point", core.index.points)):
        free = table.free_rows[:table.free_count]
        live = _live(table.state, table.s_free)
        if len(np.unique(free)) != len(free) or set(free.tolist()) & set(live.tolist()) \
                or len(free) + len(live) != table.capacity:
            out.append(f"{name} rows: free rows and entries do not partition the table")
    reqs = core.requests.live()
    steps = [r.draft for r in reqs if r.draft is not None]
    if core.index.blocks.reserved != sum(r.block_rows for r in reqs) + sum(d.blocks for d in steps) or \
            core.index.points.reserved != sum(r.point_rows for r in reqs) + sum(d.points for d in steps):
        out.append("index rows reserved do not match what requests in flight reserved")
    out += [f"request {r.rid} reserves {r.block_rows} block / {r.point_rows} point rows, not the "
            f"{r.allocated // core.block_tokens - len(r.chain)} / {len(r.pending_points)} its allocated tokens use"
            for r in reqs if r.block_rows != r.allocated // core.block_tokens - len(r.chain)
            or r.point_rows != len(r.pending_points)]  # F15: nothing reserved beyond what a request can use
    if core.index.keys.count != len(_live(core.index.blocks.state, core.index.blocks.s_free)):
        out.append("the key table and the block table hold different numbers of blocks")
    return out


def _lru_order(core: Core) -> list[str]:
    """Every indexed block off the live chains has one current eviction-order entry, after its children's
    (a live chain's blocks get theirs when its request releases; until then nothing evicts them)."""
    policy, blocks = core.index.policy, core.index.blocks
    order = getattr(policy, "order", None)
    if order is None:
        return []
    entries = order()
    live = _live(blocks.state, blocks.s_free)
    on_chain = np.zeros(blocks.capacity, np.bool_)
    for req in core.requests.live():
        on_chain[req.chain.view()] = True
    listed = set(entries.tolist())
    if len(listed) != len(entries) or not listed <= set(live.tolist()):
        return ["the eviction order lists a block twice or a block not indexed"]
    unlisted = [b for b in live.tolist() if b not in listed and not on_chain[b]]
    if unlisted:
        return [f"indexed block {unlisted[0]} off every live chain has no eviction-order entry"]
    place = np.full(blocks.capacity, -1, np.int64)
    place[entries] = np.arange(len(entries))
    child = live[blocks.parent[live] != NO_BLOCK]
    parent = blocks.parent[child]
    late = child[~on_chain[parent] & (place[child] > place[parent])]
    return [f"block {b} comes after its parent {blocks.parent[b]} in the eviction order" for b in late.tolist()[:8]]


def refcount_matches_leases(core: Core) -> list[str]:
    o = core.objects
    pins = Counter[int]()
    for req in core.requests.live():
        pins.update(req.pins.objs.tolist())
    return [f"{_name(o, b)}: leases {o.leases[b]}, lease lists name it {pins[b]}x"
            for b in set(np.flatnonzero(o.leases).tolist()) | set(pins) if o.leases[b] != pins[b]]


def tier_loads_pinned(core: Core) -> list[str]:
    """Every tier load in flight is LOADING for a load plan in flight, and every object it writes is one of
    that plan's targets, FILLING for the plan's request and copy-pinned; `PagePools.loads` counts exactly the
    loads writing each object."""
    o, out = core.objects, []
    marks = np.zeros_like(o.loads)
    loading = core.loads.table.state_id(State.LOADING)
    for (plan_id, record), load in core.loads.loads.items():
        plan = core.plans.get(plan_id)
        req = core.requests.by_rid.get(plan.request_id) if plan is not None else None
        if plan is None or not plan.load or req is None or req.slot != load.actor or load.state != loading:
            out.append(f"tier load {record!r} of plan {plan_id} is not LOADING for a load plan in flight")
            continue
        np.add.at(marks, load.targets, 1)
        bad = load.targets[~(o.filling[o.code[load.targets]] & (o.owner[load.targets] == load.actor)
                             & (o.copies[load.targets] > 0) & np.isin(load.targets, plan.fills))]
        out += [f"tier load {record!r} of plan {plan_id} writes {_name(o, b)} ({o.state_name(b)})" for b in bad]
    if not np.array_equal(marks, o.loads):
        out.append("objects' tier-load marks are not the loads in flight writing them")
    return out


def _references(core: Core) -> Counter[int]:
    """How many live index entries (blocks, points) refer to each object."""
    refs = Counter[int]()
    for table in (core.index.blocks, core.index.points):
        live = _live(table.state, table.s_free)
        for _, column in table.refs:
            refs.update(column[live].ravel().tolist())
    refs.pop(NULL_OBJECT, None)
    return refs


def references_counted(core: Core) -> list[str]:
    o, refs = core.objects, _references(core)
    return [f"{_name(o, b)}: holders {o.holders[b]}, index entries {refs[b]}"
            for b in set(np.flatnonzero(o.holders).tolist()) | set(refs) if o.holders[b] != refs[b]]


def snapshots_unshared(core: Core) -> list[str]:
    """Point snapshots (tail and recurrent-state pages): referred to by at most one live index entry, a resume
    point, never by a block; no live request computes in one (its working page is its own copy)."""
    o, out = core.objects, []
    snapshot = np.array([pool.spec.kind in core.spec.snapshot_kinds for pool in o.pools], np.bool_)[o.pool]
    snapshot[NULL_OBJECT] = False
    blocks = core.index.blocks
    for _, column in blocks.refs:
        listed = column[_live(blocks.state, blocks.s_free)].ravel()
        out += [f"{_name(o, b)} is a point snapshot referred to by a block"
                for b in set(listed[snapshot[listed]].tolist())]
    points = core.index.points
    counts = Counter[int]()
    for _, column in points.refs:
        listed = column[_live(points.state, points.s_free)].ravel()
        counts.update(listed[snapshot[listed]].tolist())
    out += [f"{_name(o, b)} is the snapshot of {n} resume points" for b, n in counts.items() if n > 1]
    for req in core.requests.live():
        for pool in o.pools:
            working = _working_object(req, pool) if pool.spec.point_snapshot else NULL_OBJECT
            if working != NULL_OBJECT and working in counts:
                out.append(f"request {req.rid} computes in {_name(o, working)}, a resume point's snapshot")
    return out


def _working_object(req: RequestState, pool: PoolSlots) -> int:
    """The object a request's next tokens write in a snapshot pool: its working tail, or (state columns) the
    column of the last token it allocated past those it computed (NULL_OBJECT: none)."""
    table = req.tables[pool.index]
    if not pool.spec.state_columns:
        return int(table[0]) if table else NULL_OBJECT
    column = (req.allocated - 1) // pool.spec.tokens_per_page
    return int(table[column]) if req.allocated > req.computed and column < len(table) else NULL_OBJECT


def referenced_objects_indexable(core: Core) -> list[str]:
    o = core.objects
    ok = o.codes_in(*core.spec.indexable_states)
    return [f"{_name(o, b)} is referenced by the index in state {o.state_name(b)}"
            for b in _references(core) if not ok[o.code[b]]]


def index_closed(core: Core) -> list[str]:
    blocks, points = core.index.blocks, core.index.points
    live = _live(blocks.state, blocks.s_free)
    parents = blocks.parent[live]
    orphans = live[(parents != NO_BLOCK) & (blocks.state[np.maximum(parents, 0)] != blocks.s_indexed)]
    out = [f"block {b}'s parent {blocks.parent[b]} is not indexed" for b in orphans.tolist()[:8]]
    kept = _live(points.state, points.s_free)
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
                            immutable_when_frozen, slot_single_owner, no_slot_leak, blocks_exclusive,
                            freed_blocks_unreachable, refcount_matches_leases,
                            tier_loads_pinned, snapshots_unshared, references_counted,
                            referenced_objects_indexable, index_closed,
                            live_chains_indexed, ahead_never_published)})


def check_invariants(manager: HasCore | Core) -> list[str]:
    """Every violated invariant of the spec on the live manager, as messages ('name: detail')."""
    core = manager if isinstance(manager, Core) else manager.core
    return [f"{inv.name}: {msg}" for inv in core.spec.invariants for msg in INVARIANTS[inv.name](core)]
