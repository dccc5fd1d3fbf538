"""A deliberately naive reference for the manager's hit length (tests only).

``brute_force_hit_tokens(manager, rid)`` answers the same question as
``CacheManager.match(rid).tokens`` without reusing anything from
``hkv_core.manager.hit``: it tries every candidate block boundary ``P`` from
the largest one down to 0 and returns the first one where every object the
resume point needs is present, checked one block and one page at a time with
plain Python loops over the manager's live structures:

- every block of ``[0, P)`` is in the key table (one lookup per block) and the
  blocks form the chain (alive, parent = previous block, position = index);
- every prefix pool has a non-NULL page for each of its page spans over
  ``[0, P)`` that holds an entry j < P // r (the page recorded at the last
  block of the span inside ``[0, P)``);
- every window pool has a non-NULL window page for each block overlapping
  ``[P - W + 1, P)`` (``W``: the window of the pool's layer group);
- when the layout has tail pools, the block ending at ``P`` carries a resume
  point with a non-NULL snapshot page in every tail pool;
- without partial-page copy, ``P`` is a multiple of the LCM of the block and of
  every prefix pool's tokens per page;
- an unaccepted abi id or a misaligned page size rejects every hit (0).

The block keys are recomputed from the request's tokens with the hasher's
per-block reference loop (``reference_hash_blocks``), not read from the
request, so a stale key (``FAILURES.md`` F11) also shows up as a mismatch.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager import NULL_PAGE, CacheManager, PoolRole
from hkv_core.manager.core import Core, RequestState

NO_PARENT = -1


def brute_force_hit_tokens(manager: CacheManager, rid: int) -> int:
    """The longest safe resume point of request ``rid``, found by exhaustive naive search."""
    core = manager.core
    req = core.requests[rid]
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
    for info in core.infos:
        if accepted is not None and info.spec.abi_id not in accepted:
            return True
        if info.spec.page_bytes % alignment != 0:
            return True
    return False


def _request_keys(core: Core, req: RequestState) -> NDArray[np.uint64]:
    keys: NDArray[np.uint64] = core.hasher.reference_hash_blocks(np.asarray(req.tokens), req.extra)
    return keys


def _indexed_chain(core: Core, req: RequestState, blocks: int) -> list[int]:
    """Arena ids of blocks 0, 1, ... while each is indexed and chained to the previous one."""
    keys = _request_keys(core, req)
    arena = core.arena
    chain: list[int] = []
    for k in range(min(blocks, len(keys))):
        probe = np.array([[keys[k][0], keys[k][1]]], dtype=np.uint64)
        found = int(core.keys.lookup(probe)[0])
        if found < 0:
            break
        expected_parent = chain[-1] if chain else NO_PARENT
        if not bool(arena.alive[found]) or int(arena.parent[found]) != expected_parent:
            break
        if int(arena.position[found]) != k:
            break
        if int(arena.key[found][0]) != int(keys[k][0]) or int(arena.key[found][1]) != int(keys[k][1]):
            break
        chain.append(found)
    return chain


def _usable(core: Core, chain: list[int], prefix: int) -> bool:
    """Can a request resume at ``prefix`` tokens from what the index holds?"""
    block = core.block_tokens
    blocks = prefix // block
    if blocks > len(chain):
        return False
    if not core.config.allow_partial_page_copy and prefix % _lcm_tokens(core) != 0:
        return False
    arena = core.arena
    prefix_col = window_col = tail_col = 0
    has_tails = False
    for info in core.infos:
        if info.role is PoolRole.PREFIX:
            col, prefix_col = prefix_col, prefix_col + 1
            page_tokens, ratio = info.spec.tokens_per_page, max(1, info.spec.compress_ratio)
            needed_entries = prefix // ratio  # entries j < P // r; a span with none of them is not read
            span_start = 0
            while span_start // ratio < needed_entries:
                span_end = min(span_start + page_tokens, prefix)
                last_block = chain[span_end // block - 1]
                if int(arena.prefix_pages[last_block][col]) == NULL_PAGE:
                    return False
                span_start += page_tokens
        elif info.role is PoolRole.WINDOW:
            col, window_col = window_col, window_col + 1
            window = core.layout.group(info.spec.group_name).window_tokens
            first_token = max(0, prefix - window + 1)
            for k in range(first_token // block, blocks):  # the blocks overlapping [first_token, prefix)
                if int(arena.window_pages[chain[k]][col]) == NULL_PAGE:
                    return False
        else:
            col, tail_col = tail_col, tail_col + 1
            has_tails = True
            if int(arena.tail_pages[chain[blocks - 1]][col]) == NULL_PAGE:
                return False
    return not has_tails or bool(arena.point[chain[blocks - 1]])


def _lcm_tokens(core: Core) -> int:
    lcm = core.block_tokens
    for info in core.infos:
        if info.role is PoolRole.PREFIX:
            lcm = math.lcm(lcm, info.spec.tokens_per_page)
    return lcm
