"""A deliberately naive reference for the manager's hit length (tests only).

``brute_force_hit_tokens(manager, rid)`` answers the same question as
``CacheManager.match(rid).tokens`` without reusing anything from
``hkv_core.manager.match`` or the role objects: it tries every candidate
block boundary ``P`` from the largest one down to 0 and returns the first one
where every object the resume point needs is present, checked one block and
one page at a time with plain Python loops over the prefix index's tables
(``core.index.blocks`` / ``.points`` / ``.keys``) and the layout's pools:

- every block of ``[0, P)`` is in the key table (one lookup per block) and the
  blocks form the chain (INDEXED, parent = previous block, the same key);
- every prefix pool (compressed KV, indexer keys) has a non-NULL, PUBLISHED
  object for each of its page spans over ``[0, P)`` that holds an entry
  j < P // r: the object the block table records, in the column of the pool's
  page pool, at the last block of the span inside ``[0, P)`` (a page the
  request stopped in was sealed at release and is recorded on the blocks it
  completed);
- when the layout has window or tail pools, a resume point is KEPT on the
  block ending at ``P`` (the block's point is a KEPT row of the point table
  recorded for that block): the point is the one owner of the
  window pages and tail snapshots a hit at ``P`` reads;
- without partial-page copy, ``P`` is a multiple of the LCM of the block and of
  every prefix pool's tokens per page;
- an unaccepted abi id or a misaligned page size rejects every hit (0).

The block keys are recomputed from the request's tokens with the hasher's
per-block reference loop (``reference_hash_blocks``), not read from the
request, so a stale key (docs/failures.md, F11) also shows up as a mismatch.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from hkv_core.layout import EntryKind, ObjectKind, PoolSpec
from hkv_core.manager import CacheManager
from hkv_core.manager.core import Core
from hkv_core.manager.lanes import managed_pools
from hkv_core.manager.requests import RequestState

NO_BLOCK = -1
NO_POINT = -1
NULL_OBJECT = 0
PREFIX_KINDS = {(ObjectKind.COMPRESSED_KV, EntryKind.COMPRESSED_ENTRY),
                (ObjectKind.INDEXER_STATE, EntryKind.COMPRESSED_ENTRY)}


def brute_force_hit_tokens(manager: CacheManager, rid: int) -> int:
    """The longest safe resume point of request ``rid``, found by exhaustive naive search."""
    core = manager.core
    req = core.requests.by_rid[rid]
    if _rejected(core):
        return 0
    block = core.block_tokens
    total = len(req.tokens)
    top = max(0, (total - 1) // block * block)
    chain = _indexed_chain(core, req, top // block)
    for prefix in range(top, 0, -block):
        if _usable(core, chain, prefix):
            return prefix
    return 0


def _rejected(core: Core) -> bool:
    """Layers 2 and 4: an abi id the executor does not accept, or a page size off the alignment."""
    accepted = core.config.accepted_abi
    alignment = core.config.device_alignment_bytes
    if alignment is None:
        alignment = core.layout.alignment_bytes
    for spec in managed_pools(core.layout, core.config):
        if accepted is not None and spec.abi_id not in accepted:
            return True
        if spec.page_bytes % alignment != 0:
            return True
    return False


def _request_keys(core: Core, req: RequestState) -> NDArray[np.uint64]:
    keys: NDArray[np.uint64] = core.hasher.reference_hash_blocks(np.asarray(req.tokens), req.extra)
    return keys


def _indexed_chain(core: Core, req: RequestState, blocks: int) -> list[int]:
    """Block ids of blocks 0, 1, ... while each is indexed and chained to the previous one."""
    keys = _request_keys(core, req)
    table = core.index.blocks
    indexed = table.table.state_id("INDEXED")
    chain: list[int] = []
    for k in range(min(blocks, len(keys))):
        probe = np.array([[keys[k][0], keys[k][1]]], dtype=np.uint64)
        found = int(core.index.keys.lookup(probe)[0])
        if found < 0:
            break
        expected_parent = chain[-1] if chain else NO_BLOCK
        if int(table.state[found]) != indexed or int(table.parent[found]) != expected_parent:
            break
        if int(table.key[found][0]) != int(keys[k][0]) or int(table.key[found][1]) != int(keys[k][1]):
            break
        chain.append(found)
    return chain


def _is_prefix(spec: PoolSpec) -> bool:
    return (spec.object_kind, spec.entry_kind) in PREFIX_KINDS


def _needs_points(core: Core) -> bool:
    """Window or tail pools: a hit reads window rows and tail snapshots, which only resume points hold."""
    return any(not _is_prefix(spec) for spec in managed_pools(core.layout, core.config))


def _block_column(core: Core, name: str) -> int:
    """The block-table column of the page pool that layout pool `name` is a member of."""
    for col, (pool, _) in enumerate(core.index.blocks.refs):
        if name in pool.spec.member_names:
            return col
    raise AssertionError(f"prefix pool {name} has no block-table column")


def _published(core: Core, obj: int) -> bool:
    return obj != NULL_OBJECT and core.objects.state_name(obj) == "PUBLISHED"


def _usable(core: Core, chain: list[int], prefix: int) -> bool:
    """Can a request resume at ``prefix`` tokens from what the index holds?"""
    block = core.block_tokens
    blocks = prefix // block
    if blocks > len(chain):
        return False
    if not core.config.allow_partial_page_copy and prefix % _lcm_tokens(core) != 0:
        return False
    table = core.index.blocks
    for spec in managed_pools(core.layout, core.config):
        if not _is_prefix(spec):
            continue
        col = _block_column(core, spec.name)
        page_tokens, ratio = spec.tokens_per_page, max(1, spec.compress_ratio)
        needed_entries = prefix // ratio  # entries j < P // r; a span with none of them is not read
        span_start = 0
        while span_start // ratio < needed_entries:
            span_end = min(span_start + page_tokens, prefix)
            last_block = chain[span_end // block - 1]
            if not _published(core, int(table.refs[col][1][last_block][0])):
                return False
            span_start += page_tokens
    if _needs_points(core):
        return _point_kept(core, chain[blocks - 1])
    return True


def _point_kept(core: Core, block_id: int) -> bool:
    """A KEPT resume point is recorded on block `block_id` (the block ending at P), for that block."""
    points = core.index.points
    row = int(core.index.blocks.point[block_id])
    if row == NO_POINT:
        return False
    kept = int(points.state[row]) == points.table.state_id("KEPT")
    return kept and int(points.block[row]) == block_id


def _lcm_tokens(core: Core) -> int:
    lcm = core.block_tokens
    for spec in managed_pools(core.layout, core.config):
        if _is_prefix(spec):
            lcm = math.lcm(lcm, spec.tokens_per_page)
    return lcm
