"""Layer 3 (and LCM rounding) as arrays: for each condition, is resume point b usable?

A condition row covers candidates b in [lo, n] (b blocks of the matched
chain): match evaluates a short window below the longest candidate first and
widens it only when no candidate in it passes every condition, so a hit on a
million-token prompt costs O(window) array work per pool beyond a few
whole-chain reductions.  Rows are exact: row[b - lo] is what a full pass
would give at b.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.core import Core
from hkv_core.manager.pools import NULL_PAGE, PoolRole

Bools = NDArray[np.bool_]
Condition = tuple[str, str, str, Bools]  # (layer, reason code, where, usable at b = lo..n)
MISSING_CODE = {("compressed_kv", PoolRole.PREFIX): "COMPRESSED_MISSING",
                ("indexer_state", PoolRole.PREFIX): "INDEXER_MISSING",
                ("indexer_state", PoolRole.TAIL): "INDEXER_MISSING",
                ("compressor_tail", PoolRole.TAIL): "TAIL_MISSING",
                ("swa_window", PoolRole.WINDOW): "WINDOW_MISSING"}


def conditions(core: Core, ids: NDArray[np.int32], lo: int = 0) -> list[Condition]:
    """Every condition over candidates b in [lo, len(ids)], pools in index order, then LCM rounding."""
    usable = np.empty((len(core.infos), len(ids) + 1 - lo), np.bool_)
    for role, rows in _ROWS.items():
        if core.by_role[role]:
            usable[core.by_role[role]] = rows(core, ids, lo)
    if lo == 0:
        usable[:, 0] = True  # resuming at 0 needs nothing
    out = [("multi_group", MISSING_CODE[(info.kind, info.role)], info.name, usable[info.index])
           for info in core.infos]
    if not core.config.allow_partial_page_copy:
        candidates = np.arange(lo, len(ids) + 1) * core.block_tokens
        out.append(("whole_block", "LCM_ROUNDED", f"lcm={core.lcm_tokens}", candidates % core.lcm_tokens == 0))
    return out


def pages_needed(core: Core, pool: int, blocks: NDArray[np.int64]) -> NDArray[np.int64]:
    """Pages of a prefix pool that a resume point after `blocks` blocks reads: entries j < P // r only."""
    spec = core.infos[pool].spec
    entries = blocks * core.block_tokens // max(1, spec.compress_ratio)
    return np.asarray(-(-entries // spec.entries_per_page))


def _prefix_rows(core: Core, ids: NDArray[np.int32], lo: int) -> Bools:
    """Per prefix pool: every page needed at b is indexed (full pages at their last block, a partial one at b-1)."""
    pools, b = core.by_role[PoolRole.PREFIX], np.arange(lo, len(ids) + 1)
    ok = core.arena.prefix_pages[ids] != NULL_PAGE  # (blocks, prefix pools)
    previous = ok[lo - 1:] if lo else np.concatenate([np.ones((1, len(pools)), np.bool_), ok])  # block b - 1
    rows = np.empty((len(pools), len(b)), np.bool_)
    for col, pool in enumerate(pools):
        per_page = core.infos[pool].spec.tokens_per_page // core.block_tokens
        need, full = pages_needed(core, pool, b), b // per_page
        whole = np.minimum(need, full)  # whole pages read at b: nondecreasing in b
        page_ok = ok[per_page - 1::per_page, col]  # each whole page, at its last block
        first = int(whole[0])
        before = np.concatenate([[bool(page_ok[:first].all())], page_ok[first:]])
        np.logical_and.accumulate(before, out=before)
        rows[col] = before[whole - first] & ((need <= full) | previous[:, col])
    return rows


def _window_rows(core: Core, ids: NDArray[np.int32], lo: int) -> Bools:
    """Per window pool: every block in [b - W + 1, b) has its window page (only blocks near the window read)."""
    pools, b = core.by_role[PoolRole.WINDOW], np.arange(lo, len(ids) + 1)
    firsts = [np.maximum(0, b * core.block_tokens - core.window_tokens[p] + 1) // core.block_tokens for p in pools]
    start = min(int(f[0]) for f in firsts)  # the first block any candidate's window reads
    missing = np.zeros((len(ids) + 1 - start, len(pools)), np.int32)
    np.cumsum(core.arena.window_pages[ids[start:]] == NULL_PAGE, axis=0, out=missing[1:])
    rows = np.empty((len(pools), len(b)), np.bool_)
    for col, first in enumerate(firsts):
        rows[col] = missing[b - start, col] == missing[np.minimum(first, b) - start, col]
    return rows


def _tail_rows(core: Core, ids: NDArray[np.int32], lo: int) -> Bools:
    """Per tail pool: a resume point with its snapshot is kept at b."""
    rows = np.zeros((len(core.by_role[PoolRole.TAIL]), len(ids) + 1 - lo), np.bool_)
    ends = ids[max(lo, 1) - 1:]  # the last block of each candidate b >= 1
    rows[:, rows.shape[1] - len(ends):] = (core.arena.tail_pages[ends] != NULL_PAGE).T & core.arena.point[ends]
    return rows


_ROWS = {PoolRole.PREFIX: _prefix_rows, PoolRole.WINDOW: _window_rows, PoolRole.TAIL: _tail_rows}
