"""What the adapter keeps per vLLM request: its hkv request and the blocks vLLM sees.

vLLM's scheduler keeps a request's block list append-only while it runs and
writes the KV of position i into block `blocks[i // block_size]`; hkv's page
table of the request is that list (one page per block).  `Blocks` holds one
`KVCacheBlock` object per vLLM block id with its `ref_cnt`: the number of live
requests whose list holds it, as vLLM's own block pool counts it.
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
    committed: int = 0  # tokens committed in hkv (written and known)
    hit: Hit | None = None
    acquired: bool = False
    blocks: list[Any] = attrs.field(factory=list)  # the request's KVCacheBlocks, in position order


class Blocks:
    """One KVCacheBlock per vLLM block id (0: the null block) and how many are held by live requests."""

    def __init__(self, num_blocks: int) -> None:
        from vllm.v1.core.kv_cache_utils import KVCacheBlock

        self.by_id = [KVCacheBlock(block_id=i) for i in range(num_blocks)]
        self.by_id[0].is_null = True
        self.held = 0  # blocks (not the null block) with ref_cnt > 0

    @property
    def num_blocks(self) -> int:
        return len(self.by_id)

    def take(self, entry: Entry, block_ids: list[int]) -> list[Any]:
        """Append `block_ids` to the request's list, counting the references; the blocks appended."""
        new = [self.by_id[i] for i in block_ids]
        for block in new:
            if block.ref_cnt == 0:
                self.held += 1
            block.ref_cnt += 1
        entry.blocks.extend(new)
        return new

    def drop(self, entry: Entry) -> list[Any]:
        """Remove every block from the request's list, uncounting the references; the blocks it held."""
        blocks, entry.blocks = entry.blocks, []
        for block in blocks:
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, block
            if block.ref_cnt == 0:
                self.held -= 1
        return blocks
