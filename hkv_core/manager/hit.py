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

Bools = NDArray[np.bool_]
MISSING_CODE = {("compressed_kv", PoolRole.PREFIX): "COMPRESSED_MISSING",
                ("indexer_state", PoolRole.PREFIX): "INDEXER_MISSING",
                ("indexer_state", PoolRole.TAIL): "INDEXER_MISSING",
                ("compressor_tail", PoolRole.TAIL): "TAIL_MISSING",
                ("swa_window", PoolRole.WINDOW): "WINDOW_MISSING"}


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


def conditions(core: Core, ids: NDArray[np.int32]) -> list[tuple[str, str, str, Bools]]:
    """(layer, code, pool, usable-at-candidate b for b = 0..len(ids)) for every condition, pools in order."""
    usable = np.empty((len(core.infos), len(ids) + 1), np.bool_)
    for role, rows in _USABLE.items():
        if core.by_role[role]:
            usable[core.by_role[role]] = rows(core, ids)
    usable[:, 0] = True
    out = [("multi_group", MISSING_CODE[(info.kind, info.role)], info.name, usable[info.index])
           for info in core.infos]
    if not core.config.allow_partial_page_copy:
        candidates = np.arange(len(ids) + 1) * core.block_tokens
        out.append(("whole_block", "LCM_ROUNDED", f"lcm={core.lcm_tokens}", candidates % core.lcm_tokens == 0))
    return out


def pages_needed(core: Core, pool: int, blocks: NDArray[np.int64]) -> NDArray[np.int64]:
    """Pages of a prefix pool that a resume point after `blocks` blocks reads: entries j < P // r only."""
    spec = core.infos[pool].spec
    entries = blocks * core.block_tokens // max(1, spec.compress_ratio)
    return np.asarray(-(-entries // spec.entries_per_page))


def _prefix_rows(core: Core, ids: NDArray[np.int32]) -> NDArray[np.bool_]:
    """Per prefix pool: every page needed at b is indexed (full pages at their last block, a partial one at b-1)."""
    pools, b = core.by_role[PoolRole.PREFIX], np.arange(len(ids) + 1)
    ok = core.arena.prefix_pages[ids] != NULL_PAGE  # (blocks, prefix pools)
    last_ok = np.concatenate([np.ones((1, len(pools)), np.bool_), ok])  # row b: the block before b
    rows = np.empty((len(pools), len(b)), np.bool_)
    for col, pool in enumerate(pools):
        per_page = core.infos[pool].spec.tokens_per_page // core.block_tokens
        before = np.concatenate([[True], np.logical_and.accumulate(ok[per_page - 1::per_page, col])])
        need, full = pages_needed(core, pool, b), b // per_page
        rows[col] = before[np.minimum(need, full)] & ((need <= full) | last_ok[:, col])
    return rows


def _window_rows(core: Core, ids: NDArray[np.int32]) -> NDArray[np.bool_]:
    """Per window pool: every block in [b - W + 1, b) has its window page."""
    pools, b = core.by_role[PoolRole.WINDOW], np.arange(len(ids) + 1)
    missing = np.zeros((len(ids) + 1, len(pools)), np.int32)
    np.cumsum(core.arena.window_pages[ids] == NULL_PAGE, axis=0, out=missing[1:])
    rows = np.empty((len(pools), len(b)), np.bool_)
    for col, pool in enumerate(pools):
        first = np.maximum(0, b * core.block_tokens - core.window_tokens[pool] + 1) // core.block_tokens
        rows[col] = missing[:, col] == missing[np.minimum(first, b), col]
    return rows


def _tail_rows(core: Core, ids: NDArray[np.int32]) -> NDArray[np.bool_]:
    """Per tail pool: a resume point with its snapshot is kept at b."""
    rows = np.zeros((len(core.by_role[PoolRole.TAIL]), len(ids) + 1), np.bool_)
    rows[:, 1:] = (core.arena.tail_pages[ids] != NULL_PAGE).T & core.arena.point[ids]
    return rows


_USABLE = {PoolRole.PREFIX: _prefix_rows, PoolRole.WINDOW: _window_rows, PoolRole.TAIL: _tail_rows}


def fixed_point(top: int, conds: list[tuple[str, str, str, Bools]]) -> tuple[int, list[Reason]]:
    """Largest b <= top usable under every condition, and the conditions that lowered it."""
    usable = np.stack([u for *_, u in conds]) if conds else np.ones((1, top + 1), np.bool_)
    best = np.maximum.accumulate(np.where(usable, np.arange(usable.shape[1]), 0), axis=1)
    b, lowered = top, dict[tuple[str, str], list[str]]()
    while True:
        limits = best[:, b].tolist()
        new = min(limits)
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
    blocks, lowered = fixed_point(len(ids), conditions(core, ids))
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
