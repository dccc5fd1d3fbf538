"""Read-only views of a manager's state, in executor terms (pools and pages), for tests and tools.

Everything here copies; nothing returned aliases the manager's arrays.  A
page's state is the state of the object placed in it (FREE when none);
`snapshot` is a hashable fingerprint of everything a later call can depend
on (tests assert that a failed call leaves it unchanged).
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.errors import InvalidArgument, UnknownPool
from hkv_core.manager.core import Core
from hkv_core.manager.lanes import managed_pools
from hkv_core.manager.page_pools import NO_OWNER, NULL_OBJECT, PoolSlots
from hkv_core.manager.requests import DraftState, RequestState


@attrs.frozen(kw_only=True)
class PageView:
    """Lifecycle facts of some pages of one pool (arrays aligned with `pages`)."""

    pages: NDArray[np.int64]
    states: tuple[str, ...]
    versions: NDArray[np.int64]
    leases: NDArray[np.int32]
    holders: NDArray[np.int32]
    copies: NDArray[np.int32]
    owners: tuple[int | None, ...]  # request id owning each page's object (None: nobody)


def pool_of(core: Core, name: str, action: str) -> PoolSlots:
    """The page pool called `name` (a managed pool of the layout); UnknownPool, listing the managed pools, for
    any other name or a non-string."""
    pool = core.member.get(name) if isinstance(name, str) else None
    if pool is None:
        known = tuple(spec.name for spec in managed_pools(core.layout, core.config))
        raise UnknownPool(pool=name, known=known, action=action)
    return pool


def page_ids(pool: PoolSlots, name: str, which: object) -> NDArray[np.int64]:
    """`which` as page ids of `pool` (called `name`): a 1-D sequence of integers in [0, pages], NULL page 0
    included; else InvalidArgument naming `which`."""
    pages = len(pool.slot_object)
    reason = f"must be a sequence of integer page ids of pool {name} in [0, {pages - 1}]"
    try:
        ids = np.asarray(which)
    except (TypeError, ValueError):
        raise InvalidArgument(action="pages", argument="which", value=which, reason=reason) from None
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        got = (f"{ids.dtype} values" if ids.ndim == 1 else f"a {ids.ndim}-D array" if ids.ndim
               else type(which).__name__)
        raise InvalidArgument(action="pages", argument="which", value=which, reason=f"{reason}, got {got}")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= pages):
        raise InvalidArgument(action="pages", argument="which", value=which,
                              reason=f"{reason}, got ids in [{int(ids.min())}, {int(ids.max())}]")
    return ids.astype(np.int64)


def pages(core: Core, name: str, which: object = None) -> PageView:
    """Facts about pages `which` of pool `name` (all pages when None); UnknownPool, InvalidArgument (`page_ids`)."""
    pool, o = pool_of(core, name, "pages"), core.objects
    ids = np.arange(len(pool.slot_object)) if which is None else page_ids(pool, name, which)
    objs = pool.slot_object[ids]
    placed = objs != NULL_OBJECT
    owners = tuple(_rid(core, int(s)) if ok else None for s, ok in zip(o.owner[objs].tolist(), placed.tolist(),
                                                                         strict=True))
    states = tuple(o.state_name(int(b)) if ok else "FREE" for b, ok in zip(objs.tolist(), placed.tolist(),
                                                                           strict=True))
    zero32 = np.zeros(len(ids), np.int32)
    return PageView(pages=ids, states=states, versions=np.where(placed, o.version[objs], -1),
                    leases=np.where(placed, o.leases[objs], zero32),
                    holders=np.where(placed, o.holders[objs], zero32),
                    copies=np.where(placed, o.copies[objs], zero32), owners=owners)


def _rid(core: Core, slot: int) -> int | None:
    req = core.requests.by_slot[slot] if slot != NO_OWNER else None
    return None if req is None else req.rid


def free_pages(core: Core, name: str) -> int:
    return pool_of(core, name, "free_pages").free_count


def pinned(core: Core, req: RequestState) -> dict[str, dict[int, int]]:
    """Per pool: the pages the request's lease lists and the version each had when pinned."""
    out, o = {}, core.objects
    objs, versions = req.pins.objs, req.pins.versions
    for pool in core.pools:
        mine = o.pool[objs] == pool.index
        listed = dict(zip(o.slot[objs[mine]].tolist(), versions[mine].tolist(), strict=True))
        for member in pool.spec.members:
            out[member.name] = dict(listed)
    return out


def owned(core: Core, req: RequestState) -> dict[str, list[int]]:
    """Per pool: the pages whose objects the request owns (private, not yet published), ascending."""
    out, o = {}, core.objects
    for pool in core.pools:
        mine = np.flatnonzero((o.owner == req.slot) & (o.pool == pool.index))
        for member in pool.spec.members:
            out[member.name] = sorted(o.slot[mine].tolist())
    return out


def tables(core: Core, req: RequestState) -> dict[str, list[int]]:
    """Per pool: the request's page table (pages; NULL where released)."""
    out = {}
    for pool in core.pools:
        listed = core.objects.slot[req.tables[pool.index].view()].tolist()
        for member in pool.spec.members:
            out[member.name] = list(listed)
    return out


def index_counts(core: Core) -> dict[str, int]:
    """How many blocks, resume points and keys the index holds."""
    return {"blocks": core.index.blocks.live, "points": core.index.points.live, "keys": core.index.keys.count}


def snapshot(core: Core) -> tuple[Any, ...]:
    """A hashable fingerprint of all mutable state (pools, index, requests, plans), eviction order included."""
    o = core.objects
    pools = (o.code.tobytes(), o.version.tobytes(), o.leases.tobytes(), o.copies.tobytes(), o.holders.tobytes(),
             o.owner.tobytes(), o.slot.tobytes(), o.full_token.tobytes(), o.row_token.tobytes(),
             tuple((p.space.free[:p.space.count].tobytes(), p.free_objects[:p.free_object_count].tobytes())
                   for p in core.pools))
    b, pt = core.index.blocks, core.index.points
    live, kept = np.flatnonzero(b.state != b.s_free), np.flatnonzero(pt.state != pt.s_free)
    index = (live.tobytes(), b.key[live].tobytes(), b.parent[live].tobytes(),
             b.point[live].tobytes(), b.version.tobytes(), b.reserved, pt.reserved, kept.tobytes(),
             pt.block[kept].tobytes(), pt.anchor[kept].tobytes(), pt.version.tobytes(),
             tuple(c[live].tobytes() for _, c in b.refs), tuple(c[kept].tobytes() for _, c in pt.refs),
             getattr(core.index.policy, "order", lambda: np.zeros(0))().tobytes(), core.index.keys.count)
    reqs = tuple(_request_snapshot(r) for r in sorted(core.requests.live(), key=lambda r: r.rid))
    plans = (tuple(sorted((k, v.request_id, v.fills.tobytes()) for k, v in core.plans.items())),
             core.loads.snapshot(), o.loads.tobytes())
    return pools, index, reqs, plans, core.requests.next_rid, core.next_plan, tuple(sorted(core.stats.items()))


def _request_snapshot(r: RequestState) -> tuple[Any, ...]:
    return (r.rid, r.slot, r.computed, r.allocated, r.hit_tokens, r.junction_tokens, r.acquired,
            r.tokens.tobytes(),
            r.chain.view().tobytes(), tuple(t.view().tobytes() for t in r.tables),
            r.pins.objs.tobytes(), r.pins.versions.tobytes(),
            tuple(r.window_floor), tuple(r.pending_points),
            tuple(sorted((p, tuple(o)) for p, o in r.snapshots.items())),
            tuple(sorted((p, tuple(o)) for p, o in r.snapshot_points.items())), tuple(sorted(r.tail_sources.items())),
            r.block_rows, r.point_rows, tuple(sorted(r.plans)), r.failed_plan, _draft_snapshot(r.draft))


def _draft_snapshot(d: DraftState | None) -> tuple[Any, ...] | None:
    if d is None:
        return None
    return (d.start, d.verified, d.tokens.tobytes(), tuple(d.table_lens), tuple(sorted(
        (p, tuple(s)) for p, s in d.segments.items())), tuple(sorted((p, tuple(s)) for p, s in d.snapshots.items())),
            tuple(d.boundaries), d.blocks, d.points)
