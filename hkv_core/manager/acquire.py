"""Acquire: check a hit against the index as it is now, then pin every object it reads (all or nothing).

A Hit is evidence, not authority: acquire re-derives the objects the hit's
blocks and resume point read from the index (the same `hit_objects` match
uses) and refuses the hit with StaleLease when a block or the point left the
index or was recycled, when an object's version or state moved, or when the
pages the hit lists are not the pages the index holds for it.  Only then does
it pin them all in one lifecycle step, and seed the request's tables.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from hkv_core.arrays import any_true
from hkv_core.errors import StaleLease
from hkv_core.manager.core import Core
from hkv_core.manager.id_list import IdList
from hkv_core.manager.index import NO_POINT
from hkv_core.manager.match import hit_objects, point_of
from hkv_core.manager.page_pools import PagePools
from hkv_core.manager.records import Hit
from hkv_core.manager.requests import RequestState
from hkv_core.spec.names import Event, State

Index = NDArray[np.intp]


def verify(core: Core, req: RequestState, hit: Hit) -> list[Index]:
    """StaleLease unless the hit is what the index holds now; returns its objects per page pool.

    When nothing changed since match produced this very hit (the page pools'
    generation is the same and it is the same frozen Hit object, whose page
    mappings and arrays are read-only), its blocks, point, objects and pages
    are match's own: nothing is left to compare.  Any other hit is checked
    in full: blocks, point, and every page and version it lists.
    """
    memo = req.matched
    if memo is not None and memo[1] is hit and memo[0] == core.objects.generation:
        return memo[4]
    ids = hit.block_ids
    _check_blocks(core, req, hit)
    point = point_of(core, ids)
    _check_point(core, req, hit, point)
    objs = hit_objects(core, ids, point)
    o = core.objects
    for pool, got in zip(core.pools, objs, strict=True):
        slots, stamps, published = o.slot[got], o.version[got], o.published[o.code[got]]
        checked: tuple[object, object] = (None, None)
        for member in pool.spec.members:
            listed = (hit.pages.get(member.name), hit.versions.get(member.name))
            if listed[0] is not checked[0] or listed[1] is not checked[1]:  # members share one array per pool
                _check_pages(req, hit, member.name, o, got, slots, stamps, published)
                checked = listed
    return objs


def _check_blocks(core: Core, req: RequestState, hit: Hit) -> None:
    """Every block of the hit is still INDEXED, at the version match saw, under the request's own key."""
    ids, blocks = hit.block_ids, core.index.blocks
    if not len(ids):
        return
    moved = ((blocks.state[ids] != blocks.s_indexed) | (blocks.version[ids] != hit.block_versions)
             | np.any(blocks.key[ids] != req.keys[:len(ids)], axis=1))
    if any_true(moved):
        i = int(np.flatnonzero(moved)[0])
        raise StaleLease(pool="block", page=int(ids[i]), expected_version=int(hit.block_versions[i]),
                         found_version=int(blocks.version[ids[i]]), request_id=req.rid,
                         expected_state=State.INDEXED, found_state=blocks.table.states[int(blocks.state[ids[i]])])


def _check_point(core: Core, req: RequestState, hit: Hit, point: int) -> None:
    """The resume point the hit resumes at is still KEPT at its block, at the version match saw."""
    if not core.needs_points or not len(hit.block_ids):
        return
    points = core.index.points
    if point == hit.point and point != NO_POINT and points.version[point] == hit.point_version:
        return
    found = hit.point if hit.point != NO_POINT else point
    raise StaleLease(pool="resume_point", page=int(found), expected_version=hit.point_version,
                     found_version=int(points.version[found]) if found != NO_POINT else -1, request_id=req.rid,
                     expected_state=State.KEPT,
                     found_state=points.table.states[int(points.state[found])] if found != NO_POINT else "NONE")


def _check_pages(req: RequestState, hit: Hit, name: str, o: PagePools, objs: Index, slots: NDArray[np.int32],
                 stamps: NDArray[np.int64], published: NDArray[np.bool_]) -> None:
    """The hit lists exactly the pages `slots` of `objs` for member pool `name`, at `stamps`, each PUBLISHED."""
    listed = hit.pages.get(name, np.zeros(0, np.int32))
    recorded = hit.versions.get(name, np.zeros(0, np.int64))
    if listed.shape != slots.shape or recorded.shape != slots.shape:
        raise StaleLease(pool=name, page=-1, expected_version=-1, found_version=-1, request_id=req.rid,
                         expected_state=f"{len(slots)} pages", found_state=f"{len(listed)} pages listed by the hit")
    moved = (listed != slots) | (recorded != stamps) | ~published
    if any_true(moved):
        i = int(np.flatnonzero(moved)[0])
        raise StaleLease(pool=name, page=int(listed[i]), expected_version=int(recorded[i]),
                         found_version=int(stamps[i]) if listed[i] == slots[i] else -1, request_id=req.rid,
                         found_state=o.state_name(int(objs[i])) if listed[i] == slots[i] else "NOT_THIS_HIT")


def acquire(core: Core, req: RequestState, hit: Hit) -> None:
    """Pin the hit for the request (one step over every pool) and seed its tables and chain from it."""
    objs = verify(core, req, hit)
    req.matched = None
    every = np.concatenate(objs) if len(objs) > 1 else objs[0]
    core.objects.step(every, Event.PIN, req.slot)
    req.pins.add(every, core.objects.version[every])
    req.hit_tokens = hit.tokens
    if hit.point != NO_POINT:
        core.index.points.anchor[hit.point] = True  # a point requests resume at: eviction takes it last
    core.requests.set_committed(req, hit.tokens)
    req.allocated = hit.tokens
    req.chain = IdList(hit.block_ids)
    for role in core.roles:
        role.seed(req, [objs[p.index] for p in role.pools])
    req.acquired = True
