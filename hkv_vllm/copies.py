"""hkv's copies of blocks (a hit's partial last block; a Mamba block's state inside it), run by vLLM's worker.

With `fine_hits` the adapter lets hkv resume inside a vLLM block (every hkv
block of `FINE_HIT_TOKENS` tokens is a resume point, not only the LCM of the
groups' block sizes).  A hit ending inside a block of group g reads the
block's first rows; the request must not write into that block, which other
requests may read, so hkv's allocation copies it on write: its plan holds a
`CopyPages` op (source page, new page) per pool.  vLLM runs such copies
itself - `take_kv_cache_block_copies` hands the scheduler `KVCacheBlockCopy`
(source block, new block) pairs, the worker copies the blocks before the
step's forward pass, and the scheduler returns both blocks through
`block_pool.free_blocks` once nothing can overwrite them before the copy
ran.  `BlockCopies` turns hkv's ops into those pairs and holds both blocks
(a reference each) until vLLM returns them.  hkv's plan completes when vLLM
returns the blocks, or earlier when vLLM reports tokens past the hit
written (the step that ran the copy is done: `settle`); a request freed
before the scheduler took its copy never has it run (`cancel`: the plan
fails, the new page is never published).

vLLM's sub-block state hits (a Mamba block of several hash blocks) copy the
same way: a hit inside a state block takes a copy of it before the request's
first step writes there, and a step that starts at a point inside a state
block it then overwrites first copies the block into a snapshot page, which
hkv keeps the point on (`hkv_core/manager/roles/state.py`).  A snapshot is
no block of the request's table: the copy holds it until vLLM returns it,
then hkv holds it as the point's page.
"""

from __future__ import annotations

from typing import Any

import attrs

from hkv_core.manager import Allocation, CacheManager
from hkv_core.plan import Completion
from hkv_vllm.layout import GroupPool
from hkv_vllm.requests import Blocks, Entry

FINE_HIT_TOKENS = 16  # hkv's block with fine hits: vLLM's smallest CPU / GPU attention block


@attrs.define
class Copy:
    """One hkv plan's copies: per vLLM group, (group id, source block, new block)."""

    rid: int
    plan_id: int
    pairs: list[tuple[int, Any, Any]]
    step_start: int  # where the step the copies run before begins: written past it, they ran


class BlockCopies:
    """hkv's copy-on-write ops as vLLM block copies, held until vLLM returns their blocks."""

    def __init__(self, hkv: CacheManager, blocks: Blocks, groups: tuple[GroupPool, ...]) -> None:
        self.hkv, self.blocks, self.groups = hkv, blocks, groups
        self.pending: list[Copy] = []  # queued since the scheduler last took them
        self.held: dict[tuple[int, ...], list[Copy]] = {}  # handed to vLLM, keyed by the ids of their blocks
        self.open: dict[int, int] = {}  # hkv plan id -> request id, for plans not completed yet

    def apply(self, entry: Entry, alloc: Allocation, step_start: int) -> list[tuple[int, int]]:
        """Point the request's blocks at the copies' new pages where hkv's table now holds them (copy on write of a
        hit's block), and queue one vLLM copy per group the copied pool serves (a snapshot's too); the (group, new
        block id) of each copy."""
        if alloc.plan is None:
            return []
        pairs = []
        for op in alloc.copies:
            for group in self.groups:
                if group.pool != op.pool:
                    continue
                g, src, dst = group.group_id, group.block_id(op.src), group.block_id(op.dst)
                source, target = self.blocks.by_id[src], self.blocks.by_id[dst]
                self.blocks.ref(g, source)  # both held until vLLM returns them
                self.blocks.ref(g, target)
                table = group.block_ids(alloc.block_tables[group.pool])
                position = [b.block_id for b in entry.blocks[g]].index(src)
                if position < len(table) and table[position] == dst:  # (else a snapshot: outside the table)
                    self.blocks.replace(entry, g, position, dst)
                pairs.append((g, source, target))
        self.pending.append(Copy(rid=entry.rid, plan_id=alloc.plan.plan_id, pairs=pairs, step_start=step_start))
        self.open[alloc.plan.plan_id] = entry.rid
        return [(g, target.block_id) for g, _, target in pairs]

    def take(self) -> tuple[list[Any], list[Any]]:
        """The copies queued since the last call, as vLLM's `KVCacheBlockCopy`s, and the blocks they hold."""
        from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy

        copies, self.pending = self.pending, []
        if not copies:
            return [], []
        pairs = [pair for copy in copies for pair in copy.pairs]
        retained = [block for _, src, dst in pairs for block in (src, dst)]
        self.held[tuple(map(id, retained))] = copies
        return [KVCacheBlockCopy(src_block_id=src.block_id, dst_block_id=dst.block_id) for _, src, dst in pairs], \
            retained

    def release(self, blocks: list[Any]) -> bool:
        """vLLM returns the blocks of copies that ran (in either order): settle their plans; False when these
        blocks are no copies' this adapter handed out."""
        key = tuple(map(id, blocks))
        key = key if key in self.held else key[::-1]
        copies = self.held.pop(key, None)
        if copies is None:
            return False
        for copy in copies:
            self._complete(copy.plan_id, Completion())
            self._unhold(copy)
        return True

    def settle(self, rid: int, written: int | None = None) -> bool:
        """vLLM reports `written` tokens of the request written: complete the plans of its copies handed to vLLM
        whose step began before that (that step ran them; the blocks stay held until vLLM returns them), every
        handed one when `written` is None.  Whether none of the request's copies is still open (copies never
        handed to vLLM stay open: hkv refuses a commit while they are, their new pages hold no copy)."""
        if not self.open:  # (every commit asks: most find nothing open)
            return True
        handed = {copy.plan_id: copy.step_start for copies in self.held.values() for copy in copies}
        for plan_id in [p for p, r in self.open.items() if r == rid and p in handed]:
            if written is None or handed[plan_id] < written:
                self._complete(plan_id, Completion())
        return rid not in self.open.values()

    def cancel(self, rid: int) -> None:
        """The request is released: copies the scheduler never took will not run (their plans fail: the new
        pages are never published); those it took ran or run before anything else writes their blocks."""
        for copy in [c for c in self.pending if c.rid == rid]:
            self.pending.remove(copy)
            self._complete(copy.plan_id, Completion(ok=False, error="the request was freed before its copy ran"))
            self._unhold(copy)
        self.settle(rid)

    def _complete(self, plan_id: int, completion: Completion) -> None:
        if self.open.pop(plan_id, None) is not None:
            self.hkv.complete(plan_id, completion)

    def _unhold(self, copy: Copy) -> None:
        for g, src, dst in copy.pairs:
            self.blocks.unref(g, src)
            self.blocks.unref(g, dst)
