"""Hit validation: the four layers of specs/validation.toml over one request's prefix.

1. whole block / LCM: candidates are block boundaries leaving >= 1 token to
   compute; without partial-page copy, multiples of the prefix pages' LCM.
2. kernel ABI: every pool's abi id must be accepted by the executor.
3. multi-group intersection: per pool, the longest usable length (prefix pages
   over [0, P), window pages over [P - W + 1, P), tail snapshots at P); the hit
   is the fixed point of their minimum.
4. byte alignment: every pool's page bytes meet the device alignment.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.core import Core, RequestState
from hkv_core.manager.key_table import EMPTY
from hkv_core.manager.pools import NULL_PAGE, PoolRole
from hkv_core.manager.records import Hit, Reason
from hkv_core.manager.usable import Condition, conditions, pages_needed

SEARCH_BLOCKS = 256  # candidates below the longest one that match checks first (widened x8 when none passes)


def matched_blocks(core: Core, req: RequestState) -> tuple[NDArray[np.int32], list[Reason]]:
    """Arena ids of the longest chain of indexed blocks, and the whole-block reason if any."""
    total = len(req.tokens)
    limit = (total - 1) // core.block_tokens if total else 0
    ids = core.keys.lookup(req.keys[:limit])
    missing = np.flatnonzero(ids == EMPTY)
    found = int(missing[0]) if missing.size else limit
    reasons = []
    if found == limit and limit * core.block_tokens < total and found > 0:
        reasons.append(Reason(layer="whole_block", code="PARTIAL_BLOCK",
                              detail=f"tokens [{limit * core.block_tokens}, {total}) end inside a block "
                                     "or must be computed to produce logits"))
    return ids[:found], reasons


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
    """Largest b <= top usable under every condition, and the conditions that lowered it.

    Rows cover b in [lo, top] and some b there passes every condition, so each
    condition's limit below any b on the way down lies in the window too.
    """
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
    reasons = [Reason(layer=layer, code=code, detail="; ".join(d)) for (layer, code), d in lowered.items()]
    return b, reasons


def reject_reasons(core: Core) -> list[Reason]:
    """Layers 2 and 4: reasons that reject every hit on this manager's pools."""
    reasons = []
    accepted = core.config.accepted_abi
    alignment = core.config.device_alignment_bytes or core.layout.alignment_bytes
    for info in core.infos:
        if accepted is not None and info.spec.abi_id not in accepted:
            reasons.append(Reason(layer="kernel_abi", code="ABI_MISMATCH",
                                  detail=f"{info.name}: {info.spec.abi_id} not accepted by the executor"))
        if info.spec.page_bytes % alignment:
            reasons.append(Reason(layer="byte_alignment", code="MISALIGNED_PAGE",
                                  detail=f"{info.name}: {info.spec.page_bytes} bytes per page, "
                                         f"alignment {alignment}"))
    return reasons


def match(core: Core, req: RequestState) -> Hit:
    """Validate the request's longest cached prefix through all four layers."""
    ids, reasons = matched_blocks(core, req)
    blocks, lowered = fixed_point(len(ids), *search(core, ids))
    reasons += lowered
    rejected = reject_reasons(core) if blocks else []
    if rejected:
        blocks, reasons = 0, reasons + rejected
    tokens = blocks * core.block_tokens
    partial = any(_partial_page(core, p, tokens) for p in core.by_role[PoolRole.PREFIX])
    if tokens:
        code = "PARTIAL_PAGE_COPY" if partial else "LCM_BOUNDARY"
        reasons.append(Reason(layer="whole_block", code=code, detail=f"resume at {tokens} tokens"))
    pages = hit_pages(core, ids[:blocks])
    return Hit(request_id=req.rid, tokens=tokens, candidate_tokens=len(ids) * core.block_tokens,
               reasons=tuple(reasons), block_ids=ids[:blocks].copy(), pages=pages,
               versions={name: core.pools[core.pool_index[name]].version[p].copy() for name, p in pages.items()},
               partial_copy=bool(tokens and partial))


def _partial_page(core: Core, pool: int, tokens: int) -> bool:
    """True when the resume point reads only the first entries of its last page (copy-on-write)."""
    spec = core.infos[pool].spec
    return bool((tokens // max(1, spec.compress_ratio)) % spec.entries_per_page)


def hit_pages(core: Core, ids: NDArray[np.int32]) -> dict[str, NDArray[np.int32]]:
    """Every page a hit over blocks `ids` reads, per pool (unique, in order)."""
    if not len(ids):
        return {}
    a, b, chosen = core.arena, len(ids), dict[int, NDArray[np.int32]]()
    for col, pool in enumerate(core.by_role[PoolRole.PREFIX]):
        per_page = core.infos[pool].spec.tokens_per_page // core.block_tokens
        need = int(pages_needed(core, pool, np.array([b]))[0])
        ends = np.minimum(np.arange(per_page, (need + 1) * per_page, per_page), b) - 1
        chosen[pool] = a.prefix_pages[ids[ends], col]
    windows = core.by_role[PoolRole.WINDOW]
    if windows:
        first = min(core.window_first_block(pool, b * core.block_tokens) for pool in windows)
        rows = a.window_pages[ids[first:]]
        for col, pool in enumerate(windows):
            chosen[pool] = rows[core.window_first_block(pool, b * core.block_tokens) - first:, col]
    for col, pool in enumerate(core.by_role[PoolRole.TAIL]):
        chosen[pool] = a.tail_pages[ids[-1:], col]
    pages = {core.infos[pool].name: chosen[pool] for pool in range(len(core.infos))}
    assert np.concatenate(list(pages.values())).min() > NULL_PAGE, "a validated hit reads a NULL page"
    return pages


def empty(rid: int) -> Hit:
    """The hit of a request that computes everything (no cached prefix)."""
    return Hit(request_id=rid, tokens=0, candidate_tokens=0, reasons=(), block_ids=np.zeros(0, np.int32),
               pages={}, versions={}, partial_copy=False)
