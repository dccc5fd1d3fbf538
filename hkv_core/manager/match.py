"""Match: the four validation layers of specs/validation.toml over one request's prefix.

1. whole block / LCM: candidates are block boundaries leaving >= 1 token to
   compute; without partial-page copy, multiples of the prefix pages' LCM.
2. kernel ABI: every pool's abi id must be accepted by the executor.
3. multi-group intersection: each role says, per pool, at which candidates
   its objects are present (prefix pages over [0, P); window pages and tail
   snapshots through a resume point kept at P); the hit is the fixed point of
   their minimum.  Match checks a window of candidates below the longest
   first and widens it only when none passes, so a hit on a million-token
   prompt costs O(window) beyond one key lookup.
4. byte alignment: every pool's page bytes meet the device alignment.

`hit_objects` (the objects a hit reads, per page pool) is shared with
acquire, which re-derives a hit's pages from the index with it.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from hkv_core.arrays import all_true
from hkv_core.manager.core import Core
from hkv_core.manager.index import NO_POINT
from hkv_core.manager.lanes import managed_pools
from hkv_core.manager.limits import SEARCH_BLOCKS
from hkv_core.manager.page_pools import NULL_OBJECT
from hkv_core.manager.records import Hit, Reason
from hkv_core.manager.requests import RequestState
from hkv_core.manager.roles import Condition

Index = NDArray[np.intp]


def matched_blocks(core: Core, req: RequestState,
                   max_tokens: int | None = None) -> tuple[NDArray[np.int32], list[Reason]]:
    """Block ids of the longest chain of indexed blocks (of at most `max_tokens` tokens), and the whole-block
    reason if any."""
    total = len(req.tokens)
    limit = (total - 1) // core.block_tokens if total else 0
    if max_tokens is not None and max_tokens // core.block_tokens < limit:
        limit = max_tokens // core.block_tokens
        ids = core.index.matched(req.keys[:limit])
        asked = Reason(layer="whole_block", code="MAX_TOKENS",
                       detail=f"the engine asked for a hit of at most {max_tokens} tokens")
        return ids, [asked] if len(ids) == limit else []
    ids = core.index.matched(req.keys[:limit])
    reasons = []
    if len(ids) == limit and limit * core.block_tokens < total and limit > 0:
        reasons.append(Reason(layer="whole_block", code="PARTIAL_BLOCK",
                              detail=f"tokens [{limit * core.block_tokens}, {total}) end inside a block "
                                     "or must be computed to produce logits"))
    return ids, reasons


def conditions(core: Core, ids: NDArray[np.int32], lo: int) -> list[Condition]:
    return [c for role in core.roles for c in role.conditions(ids, lo)]


def search(core: Core, ids: NDArray[np.int32]) -> tuple[int, list[Condition]]:
    """The lowest candidate `lo` of a window holding the answer, and the conditions over [lo, len(ids)]."""
    span = SEARCH_BLOCKS
    while True:
        lo = max(0, len(ids) - span)
        conds = conditions(core, ids, lo)
        if lo == 0 or np.logical_and.reduce([u for *_, u in conds]).any():
            return lo, conds
        span *= 8


def fixed_point(top: int, lo: int, conds: list[Condition]) -> tuple[int, list[Reason]]:
    """Largest b <= top usable under every condition, and the conditions that lowered it."""
    usable = np.stack([u for *_, u in conds]) if conds else np.ones((1, top + 1 - lo), np.bool_)
    best = np.maximum.accumulate(np.where(usable, np.arange(lo, top + 1), lo - 1), axis=1)
    b, lowered = top, dict[tuple[str, str], list[str]]()
    while True:
        limits = best[:, b - lo].tolist()
        new = min(limits)
        assert new >= lo, "the search window holds no usable candidate"
        for (layer, code, where, _), limit in zip(conds, limits, strict=False):
            if limit < b:
                lowered.setdefault((layer, code), []).append(f"{where}: usable to block {limit} < {b}")
        if new == b:
            break
        b = new
    return b, [Reason(layer=layer, code=code, detail="; ".join(d)) for (layer, code), d in lowered.items()]


def reject_reasons(core: Core) -> list[Reason]:
    """Layers 2 and 4: reasons that reject every hit on this manager's pools (layout and config are
    frozen: computed at the first match)."""
    if core.hit_rejections is None:
        core.hit_rejections = tuple(_rejections(core))
    return list(core.hit_rejections)


def _rejections(core: Core) -> list[Reason]:
    reasons = []
    accepted = core.config.accepted_abi
    alignment = core.config.device_alignment_bytes or core.layout.alignment_bytes
    for spec in managed_pools(core.layout, core.config):
        if accepted is not None and spec.abi_id not in accepted:
            reasons.append(Reason(layer="kernel_abi", code="ABI_MISMATCH",
                                  detail=f"{spec.name}: {spec.abi_id} not accepted by the executor"))
        if spec.page_bytes % alignment:
            reasons.append(Reason(layer="byte_alignment", code="MISALIGNED_PAGE",
                                  detail=f"{spec.name}: {spec.page_bytes} bytes per page, alignment {alignment}"))
    return reasons


def point_of(core: Core, ids: NDArray[np.int32]) -> int:
    """The resume point a hit after blocks `ids` resumes at (NO_POINT: none needed, or an empty hit)."""
    return int(core.index.blocks.point[ids[-1]]) if core.needs_points and len(ids) else NO_POINT


def hit_objects(core: Core, ids: NDArray[np.int32], point: int) -> list[Index]:
    """Per page pool (in pool order): the objects a hit after blocks `ids` at `point` reads."""
    out: list[Index] = [np.zeros(0, np.intp)] * len(core.pools)
    for role in core.roles:
        for pool, objs in zip(role.pools, role.hit_objects(ids, point), strict=True):
            out[pool.index] = objs
    return out


def whole_chain_usable(core: Core, ids: NDArray[np.int32]) -> list[Index] | None:
    """The objects of a hit over every matched block, when that longest candidate is usable as it is.

    The usual case (a prompt whose cached prefix ends at a kept point): one
    gather per pool decides it, and the fixed point is not needed.
    """
    if not len(ids) or not core.config.allow_partial_page_copy:
        return None
    point = point_of(core, ids)
    if core.needs_points and point == NO_POINT:
        return None
    objs = hit_objects(core, ids, point)
    return objs if all_true(np.concatenate(objs) != NULL_OBJECT) else None


def match(core: Core, req: RequestState, max_tokens: int | None = None) -> Hit:
    """Validate the request's longest cached prefix (of at most `max_tokens` tokens) through all four layers."""
    ids, reasons = matched_blocks(core, req, max_tokens)
    candidate = len(ids) * core.block_tokens
    objs = whole_chain_usable(core, ids)
    if objs is None:
        blocks, lowered = fixed_point(len(ids), *search(core, ids))
        reasons += lowered
    else:
        blocks = len(ids)
    rejected = reject_reasons(core) if blocks else []
    if rejected:
        blocks, reasons = 0, reasons + rejected
    tokens, ids = blocks * core.block_tokens, ids[:blocks]
    partial = bool(tokens) and any(role.partial(tokens) for role in core.roles)
    if tokens:
        code = "PARTIAL_PAGE_COPY" if partial else "LCM_BOUNDARY"
        reasons.append(Reason(layer="whole_block", code=code, detail=f"resume at {tokens} tokens"))
    point = point_of(core, ids)
    if max_tokens is None:  # a capped match says nothing about where the cached chain ends
        req.junction_tokens = candidate if candidate > tokens else 0  # the chain goes on there: keep a point
    if tokens and (objs is None or blocks * core.block_tokens != candidate):
        objs = hit_objects(core, ids, point)
    pages, versions = pages_of(core, objs) if tokens and objs is not None else ({}, {})
    hit = Hit(request_id=req.rid, tokens=tokens, candidate_tokens=candidate, reasons=tuple(reasons),
              block_ids=ids.copy(), block_versions=core.index.blocks.version[ids], pages=pages,
              versions=versions, partial_copy=partial, point=point,
              point_version=int(core.index.points.version[point]) if point != NO_POINT else 0)
    if tokens and objs is not None:
        req.matched = (core.objects.generation, hit, ids, point, objs)
    return hit


def pages_of(core: Core, objs: list[Index]) -> tuple[dict[str, NDArray[np.int32]], dict[str, NDArray[np.int64]]]:
    """Per member pool: the device pages of the objects and their versions (fresh arrays)."""
    pages, versions, o = {}, {}, core.objects
    for pool, got in zip(core.pools, objs, strict=True):
        slots, stamps = o.slot[got], o.version[got]  # fresh arrays, shared by the members (read-only)
        for member in pool.spec.members:
            pages[member.name], versions[member.name] = slots, stamps
    return pages, versions


def empty(rid: int) -> Hit:
    """The hit of a request that computes everything (no cached prefix)."""
    return Hit(request_id=rid, tokens=0, candidate_tokens=0, reasons=(), block_ids=np.zeros(0, np.int32),
               block_versions=np.zeros(0, np.uint32), pages={}, versions={}, partial_copy=False)
