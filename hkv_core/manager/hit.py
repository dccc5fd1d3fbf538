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
    """(layer, code, pool, usable-at-candidate b for b = 0..len(ids)) for every condition."""
    out = []
    for pool in range(len(core.infos)):
        info = core.infos[pool]
        usable = _USABLE[info.role](core, pool, ids)
        usable[0] = True
        out.append(("multi_group", MISSING_CODE[(info.kind, info.role)], info.name, usable))
    if not core.config.allow_partial_page_copy:
        candidates = np.arange(len(ids) + 1) * core.block_tokens
        out.append(("whole_block", "LCM_ROUNDED", f"lcm={core.lcm_tokens}", candidates % core.lcm_tokens == 0))
    return out


def pages_needed(core: Core, pool: int, blocks: NDArray[np.int64]) -> NDArray[np.int64]:
    """Pages of a prefix pool that a resume point after `blocks` blocks reads: entries j < P // r only."""
    spec = core.infos[pool].spec
    entries = blocks * core.block_tokens // max(1, spec.compress_ratio)
    return np.asarray(-(-entries // spec.entries_per_page))


def _prefix_usable(core: Core, pool: int, ids: NDArray[np.int32]) -> Bools:
    per_page = core.infos[pool].spec.tokens_per_page // core.block_tokens
    ok = core.arena.prefix_pages[ids, core.column[pool]] != NULL_PAGE
    before = np.concatenate([[True], np.logical_and.accumulate(ok[per_page - 1::per_page])])
    b = np.arange(len(ids) + 1)
    need, full = pages_needed(core, pool, b), b // per_page
    last_ok = np.concatenate([[True], ok])[b]  # the page recorded at block b - 1
    return np.asarray(before[np.minimum(need, full)] & np.where(need > full, last_ok, True))


def _window_usable(core: Core, pool: int, ids: NDArray[np.int32]) -> Bools:
    have = core.arena.window_pages[ids, core.column[pool]] != NULL_PAGE
    missing = np.concatenate([[0], np.cumsum(~have)])
    b = np.arange(len(ids) + 1)
    first = np.maximum(0, b * core.block_tokens - core.window_tokens[pool] + 1) // core.block_tokens
    return np.asarray(missing[b] - missing[np.minimum(first, b)] == 0)


def _tail_usable(core: Core, pool: int, ids: NDArray[np.int32]) -> Bools:
    usable = np.zeros(len(ids) + 1, np.bool_)
    usable[1:] = core.arena.point[ids] & (core.arena.tail_pages[ids, core.column[pool]] != NULL_PAGE)
    return usable


_USABLE = {PoolRole.PREFIX: _prefix_usable, PoolRole.WINDOW: _window_usable, PoolRole.TAIL: _tail_usable}


def fixed_point(top: int, conds: list[tuple[str, str, str, Bools]]) -> tuple[int, list[Reason]]:
    """Largest b <= top usable under every condition, and the conditions that lowered it."""
    best = [np.maximum.accumulate(np.where(u, np.arange(len(u)), 0)) for *_, u in conds]
    b, lowered = top, dict[tuple[str, str], list[str]]()
    while True:
        limits = [int(x[b]) for x in best]
        new = min(limits, default=b)
        for (layer, code, where, _), limit in zip(conds, limits, strict=True):
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
    pages: dict[str, NDArray[np.int32]] = {}
    if not len(ids):
        return pages
    b = len(ids)
    for pool in range(len(core.infos)):
        info, col = core.infos[pool], core.column[pool]
        if info.role is PoolRole.PREFIX:
            per_page = info.spec.tokens_per_page // core.block_tokens
            need = int(pages_needed(core, pool, np.array([b]))[0])
            ends = np.minimum((np.arange(need) + 1) * per_page, b) - 1
            chosen = core.arena.prefix_pages[ids[ends], col]
        elif info.role is PoolRole.WINDOW:
            chosen = core.arena.window_pages[ids[core.window_first_block(pool, b * core.block_tokens):], col]
        else:
            chosen = core.arena.tail_pages[ids[-1:], col]
        assert np.all(chosen != NULL_PAGE), f"a validated hit reads a NULL page of {info.name}"
        pages[info.name] = chosen.astype(np.int32)
    return pages


def empty(rid: int) -> Hit:
    """The hit of a request that computes everything (no cached prefix)."""
    return Hit(request_id=rid, tokens=0, candidate_tokens=0, reasons=(), block_ids=np.zeros(0, np.int32),
               pages={}, versions={}, partial_copy=False)
