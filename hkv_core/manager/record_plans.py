"""Plans between a request's pages and tier records: `plan_store` and `plan_load` (docs/tiers.md).

A tier stores and loads a record only through a plan the manager issues, like every other copy:

- a **store** reads row runs of pages the request may read (shared pages, or its own working pages) into a
  record's host bytes.  It changes no object's state; the plan names each page's version, checked again at
  launch (StaleLease, nothing copied, if a page moved).
- a **load** writes a record's bytes into row runs of pages the request owns and has reserved, not yet
  committed.  Issuing it fires `fill` on every target object (RESERVED -> FILLING: copy-pinned, guards
  `is_owner` and `rows_not_full`), then `load` on each record it copies (a `tier_load`, tier_loads.py: guard
  `targets_filling`); `complete` fires `copy_done` - or `copy_fail` when the executor reports the copy failed
  - on the records first, then on the targets (whose guard `no_load_in_flight` waits for their loads).  A
  failed load leaves the objects RESERVED with their rows unwritten: the engine computes them into the same
  pages and commits as it would without a tier, so a failed load costs a recompute, never a wrong row.
  (A failed copy-on-write plan differs: its rows lie before the allocation and nothing rewrites them, so
  commit is refused.)

Either way a bad argument - a pool the manager lacks, a page outside it, a page the request may not read or
write - raises before anything changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hkv_core.errors import InvalidArgument, UnknownPool
from hkv_core.manager.core import Core, PlanRecord
from hkv_core.manager.page_pools import NULL_OBJECT
from hkv_core.manager.requests import RequestState
from hkv_core.plan import LoadRecord, Plan, RecordRows, StoreRecord
from hkv_core.spec.names import Event, State


def _checked(core: Core, rows: object, action: str) -> list[RecordRows]:
    if not isinstance(rows, Sequence) or not rows or not all(isinstance(r, RecordRows) for r in rows):
        raise InvalidArgument(action=action, argument="rows", value=rows,
                              reason="a non-empty sequence of hkv_core.plan.RecordRows")
    for r in rows:
        pool = core.member.get(r.pool)
        if pool is None:
            raise UnknownPool(pool=r.pool, known=tuple(core.member), action=action)
        size = len(pool.slot_object)
        bad = [run for run in r.runs if not 0 < run[0] < size]
        if bad:
            raise InvalidArgument(action=action, argument="rows", value=r,
                                  reason=f"{r.pool}: page {bad[0][0]} is outside [1, {size})")
    return list(rows)


def _objects(core: Core, r: RecordRows) -> np.ndarray:
    pool = core.member[r.pool]
    return pool.slot_object[np.array([page for page, _, _ in r.runs], np.intp)].astype(np.intp)


def issue_store(core: Core, req: RequestState, rows: Sequence[RecordRows]) -> Plan:
    """StoreRecord ops reading `rows`; InvalidArgument when a page is not one the request may read."""
    ops = []
    for r in _checked(core, rows, "plan_store"):
        pool = core.member[r.pool]
        versions = []
        for page, _, _ in r.runs:
            obj = int(pool.slot_object[page])
            version = int(core.objects.version[obj]) if obj != NULL_OBJECT else -1
            ok, _, state = core.objects.check_page(pool.index, page, version, req.slot)
            if not ok:
                raise InvalidArgument(action="plan_store", argument="rows", value=r,
                                      reason=f"{r.pool}: page {page} ({state}) is not readable by request {req.rid}")
            versions.append(version)
        ops.append(StoreRecord(pool=r.pool, runs=r.runs, versions=versions, record=r.record, offset=r.offset,
                               first_row=r.first_row))
    return Plan(ops=ops, request_id=req.rid, label="tier store")


def issue_load(core: Core, req: RequestState, rows: Sequence[RecordRows]) -> Plan:
    """LoadRecord ops writing `rows`, their targets FILLING until `complete`; InvalidArgument when a target is
    not a RESERVED object of the request whose rows it has not committed."""
    checked = _checked(core, rows, "plan_load")
    o = core.objects
    targets = []
    for r in checked:
        objs = _objects(core, r)
        for (page, _, _), obj in zip(r.runs, objs, strict=True):  # _checked: never the NULL page
            if obj == NULL_OBJECT or int(o.owner[obj]) != req.slot or not o.reserved[o.code[obj]]:
                state = o.codes.describe(int(o.code[obj]))[1] if obj != NULL_OBJECT else State.FREE.value
                raise InvalidArgument(action="plan_load", argument="rows", value=r,
                                      reason=f"{r.pool}: page {page} ({state}) is not a page request {req.rid} "
                                             f"reserved")
        targets.append(objs)
    fills = np.unique(np.concatenate(targets))
    o.step(fills, Event.FILL, req.slot)  # IllegalTransition (nothing changed) for a row it already committed
    plan_id = core.next_plan
    by_record: dict[str, list[np.ndarray]] = {}
    for r, objs in zip(checked, targets, strict=True):
        by_record.setdefault(r.record, []).append(objs)
    try:  # each record is a tier load: IDLE -> LOADING, its targets now FILLING for the request
        core.loads.begin(plan_id, {name: np.unique(np.concatenate(parts)) for name, parts in by_record.items()},
                         req.slot)
    except BaseException:
        o.step(fills, Event.COPY_FAIL)  # back to RESERVED: a refused load leaves everything as it was
        raise
    core.next_plan += 1
    ops = [LoadRecord(pool=r.pool, runs=r.runs, versions=o.version[objs].tolist(), record=r.record,
                      offset=r.offset, first_row=r.first_row) for r, objs in zip(checked, targets, strict=True)]
    core.plans[plan_id] = PlanRecord(request_id=req.rid, fills=fills, load=True)
    req.plans.add(plan_id)
    return Plan(ops=ops, request_id=req.rid, plan_id=plan_id, label="tier load")
