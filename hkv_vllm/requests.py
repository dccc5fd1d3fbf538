"""What the adapter keeps per vLLM request: its hkv request and the blocks vLLM sees.

vLLM's scheduler keeps a request's block list per KV cache group, append-only
while it runs except that a sliding-window group's blocks that fall out of
the window become the null block; it writes the KV of position i into block
`blocks[g][i // block_size]`.  hkv's page table of the request in the group's
pool is that list (one page per block; `layout.GroupPool.block_id`).
`Blocks` holds one `KVCacheBlock` object per vLLM block id with its
`ref_cnt`: the number of live requests whose lists hold it, as vLLM's own
block pool counts it, and how many blocks live requests hold.
"""

from __future__ import annotations

from typing import Any

import attrs

from hkv_core.manager import Hit


@attrs.define(kw_only=True)
class Entry:
    """One vLLM request as the adapter knows it."""

    req_id: str         # vLLM's request id
    rid: int            # its hkv request id
    known: int          # tokens hkv was given (prompt + verified outputs)
    groups: int         # vLLM KV cache groups
    committed: int = 0  # tokens committed in hkv (written and known)
    hit: Hit | None = None
    acquired: bool = False
    unconfirmed: tuple[int, int | None] | None = None  # a KV connector's load into the request's blocks: (its
    #     first token, the written count that confirms it); commits stop at its first token until then.  None as
    #     the count: an async load, confirmed only by vLLM's report of its outcome (`cache_blocks`)
    blocks: list[list[Any]] = attrs.field(factory=list)  # per group: the request's KVCacheBlocks, in position order
    live: list[int] = attrs.field(factory=list)  # per group: the first position not yet the null block
    exports: list[int] = attrs.field(factory=list)  # prefill checkpoints of allocated steps not yet committed
    tail_offered: bool = False  # its state inside a block handed to a connector (`finalize_partial_tail_offloads`)

    def __attrs_post_init__(self) -> None:
        self.blocks = [[] for _ in range(self.groups)]
        self.live = [0] * self.groups


class Blocks:
    """One KVCacheBlock per vLLM block id (0: the null block) and how many are held by live requests."""

    def __init__(self, num_blocks: int) -> None:
        from vllm.v1.core.kv_cache_utils import KVCacheBlock

        self.by_id = tuple(KVCacheBlock(block_id=i) for i in range(num_blocks))  # fixed: blocks change, ids not
        self.by_id[0].is_null = True
        self.null = self.by_id[0]
        self.held = 0  # blocks (not the null block) with ref_cnt > 0

    @property
    def num_blocks(self) -> int:
        return len(self.by_id)

    def take(self, entry: Entry, group: int, block_ids: list[int]) -> list[Any]:
        """Append `block_ids` to the request's list of `group`, counting the references; the blocks appended."""
        new = [self.by_id[i] for i in block_ids]
        for block in new:
            if not block.is_null:
                self.ref(group, block)
        entry.blocks[group].extend(new)
        return new

    def replace(self, entry: Entry, group: int, position: int, block_id: int) -> None:
        """The request's block at `position` of `group` becomes block `block_id` (a copy on write of it)."""
        old, new = entry.blocks[group][position], self.by_id[block_id]
        self.ref(group, new)
        entry.blocks[group][position] = new
        if not old.is_null:
            self.unref(group, old)

    def to_null(self, entry: Entry, group: int, position: int) -> None:
        """The request's block at `position` of `group` left its window: the null block takes its place."""
        block = entry.blocks[group][position]
        if not block.is_null:
            entry.blocks[group][position] = self.null
            self.unref(group, block)

    def drop(self, entry: Entry) -> None:
        """Remove every block from the request's lists, uncounting the references."""
        for group, blocks in enumerate(entry.blocks):
            for block in blocks:
                if not block.is_null:
                    self.unref(group, block)
        entry.blocks = [[] for _ in entry.blocks]
        entry.live = [0] * len(entry.live)

    def ref(self, group: int, block: Any) -> None:
        """One more reference to `block` of `group` (held outside any request: a block copy in flight)."""
        if block.ref_cnt == 0:
            self.held += 1
        block.ref_cnt += 1

    def unref(self, group: int, block: Any) -> None:
        """Drop one reference to `block` of `group`."""
        block.ref_cnt -= 1
        assert block.ref_cnt >= 0, block
        if block.ref_cnt == 0:
            self.held -= 1
