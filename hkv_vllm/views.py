"""What vLLM's scheduler reads of its KV cache manager's internals, as the adapter means it.

vLLM 0.32's `Scheduler` reaches past the `KVCacheManager` interface in a few
places; each is answered here from hkv's state, never from a second block
pool:

- `coordinator.single_type_managers`: one per KV cache group, with its
  `block_size`, `kv_cache_spec`, `kv_cache_group_id`, `req_to_blocks` (the
  request's blocks, read-only), `num_cached_block` (the request's blocks
  hkv committed) and `retains_longer_hit` (False: hkv hits are one length
  for every group).
- `coordinator.get_num_blocks_to_allocate(...)`: the blocks a request still
  needs for `num_tokens` (what the scheduler's promotion check asks).
- `coordinator.enable_partial_hash_hits` / `eagle_group_ids` /
  `num_reprefillable_tokens`: vLLM's own rule for sub-block state hits
  (served) / every group with EAGLE, else () / 0 (hkv's Mamba groups keep
  no speculative blocks).
- `block_pool.get_num_free_blocks()` / `get_usage()`: blocks no live
  request holds (hkv's free pages and its evictable cached ones, as vLLM
  counts its free queue), and the share held.
- `block_pool.free_blocks(blocks)`: the scheduler's deferred frees (async
  scheduling with a KV connector that receives): the blocks of one request
  `pop_blocks_for_free` handed out, held in hkv until this call.
- `block_pool.blocks`: every block by id (a tuple: `ref_cnt` is the live
  requests holding it; `block_hash` is never set, hkv keys blocks itself).
- `block_pool.null_block`, a group's `_null_block`: the null block (id 0),
  which takes an out-of-window block's place in a request's list.
- `block_pool.free_block_queue.num_free_blocks`: `get_num_free_blocks()`.
  The queue's order (vLLM's eviction order) is not modelled: hkv evicts by
  its own policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from hkv_core.errors import InvalidArgument
from hkv_vllm.layout import GroupPool

if TYPE_CHECKING:
    from hkv_vllm.manager import HkvKVCacheManager


class GroupView:
    """One KV cache group as vLLM's single-type manager describes it."""

    retains_longer_hit = False

    def __init__(self, owner: HkvKVCacheManager, group: GroupPool, spec: Any) -> None:
        self._owner, self.kv_cache_group_id, self.block_size = owner, group.group_id, group.block_size
        self.kv_cache_spec = spec
        self.records_new_block_ids = owner.zeroing[group.group_id]  # (the blocks: owner.take_new_block_ids)

    @property
    def _null_block(self) -> Any:
        """The null block, which replaces a block that left the group's window."""
        return self._owner.blocks.null

    @property
    def req_to_blocks(self) -> Mapping[str, list[Any]]:
        """Request id -> its blocks in this group (the adapter's lists, as vLLM's are: read them, never write)."""
        g = self.kv_cache_group_id
        return {req_id: entry.blocks[g] for req_id, entry in self._owner.entries.items()}


    @property
    def cache_hit_alignment_tokens(self) -> int:
        """Where hits land: vLLM's hash block with sub-block hits, else the scheduler block."""
        return self._owner.checkpoints.hit_alignment

    @property
    def _checkpoints(self) -> Mapping[str, tuple[int, int]]:
        """A state group's prefill checkpoints of the steps allocated and not yet committed: request id -> (the
        checkpoint, its column), as vLLM's MambaManager records the one of a request's latest allocation."""
        if not self._owner.groups[self.kv_cache_group_id].state:
            return {}
        size, entries = self.block_size, self._owner.entries.items()
        return {req_id: (entry.exports[-1], entry.exports[-1] // size - 1) for req_id, entry in entries
                if entry.exports and entry.exports[-1] > entry.committed}

    @property
    def num_cached_block(self) -> Mapping[str, int]:
        """Request id -> how many of its blocks hkv has committed (vLLM: cached when scheduled; hkv: once
        computed, docs/vllm.md)."""
        size = self.block_size
        return {req_id: entry.committed // size for req_id, entry in self._owner.entries.items()}


class CoordinatorView:
    """The part of vLLM's KV cache coordinator the scheduler reads."""

    eagle_group_ids: tuple[int, ...] = ()
    num_reprefillable_tokens = 0

    def __init__(self, owner: HkvKVCacheManager, specs: list[Any]) -> None:
        self._owner = owner
        self.single_type_managers = [GroupView(owner, g, spec)
                                     for g, spec in zip(owner.vllm_layout.groups, specs, strict=True)]
        self.block_pool = owner.block_pool
        self.eagle_group_ids = tuple(range(len(specs))) if owner.use_eagle else ()  # every group drops a block
        self.enable_partial_hash_hits = owner.sub_block_hits  # (its scheduler then splits at the prompt's tail)

    @property
    def retention_interval(self) -> int | None:
        """vLLM's prefix-cache retention interval: with 0, a Mamba group keeps a prefill checkpoint only on the
        chunk that reaches the prefill's end (hkv keeps a point at every block either way)."""
        return self._owner.checkpoints.retention_interval

    @retention_interval.setter
    def retention_interval(self, value: int | None) -> None:
        self._owner.checkpoints.retention_interval = value

    def get_num_blocks_to_allocate(self, *, request_id: str, num_tokens: int, **_: Any) -> int:
        """Blocks the request needs beyond what it holds to cover `num_tokens` tokens, all groups together."""
        entry = self._owner.entries.get(request_id)
        return sum(pool.new_blocks(num_tokens, len(entry.blocks[pool.group_id]) if entry else 0)
                   for pool in self._owner.groups)


class BlockPoolView:
    """The part of vLLM's block pool the scheduler reads: counts, and deferred frees."""

    def __init__(self, owner: HkvKVCacheManager) -> None:
        self._owner = owner

    @property
    def blocks(self) -> tuple[Any, ...]:
        """Every vLLM block by id, read-only (the null block first)."""
        return self._owner.blocks.by_id

    @property
    def null_block(self) -> Any:
        return self._owner.blocks.null

    @property
    def free_block_queue(self) -> FreeQueueView:
        return FreeQueueView(self)

    @property
    def num_gpu_blocks(self) -> int:
        return self._owner.blocks.num_blocks

    @property
    def capacity(self) -> int:
        """The blocks every group draws from (`layout.py`): all but the null block."""
        return self._owner.vllm_layout.shared_pages

    def get_num_free_blocks(self) -> int:
        return self.capacity - self._owner.blocks.held

    def get_usage(self) -> float:
        return self._owner.blocks.held / max(1, self.capacity)

    def free_blocks(self, blocks: Iterable[Any]) -> None:
        """Deferred frees: the blocks of one request `pop_blocks_for_free` handed out, now written by no step
        in flight; hkv releases that request."""
        left = list(blocks)
        if left and not self._owner.free_deferred(left):
            raise InvalidArgument(action="block_pool.free_blocks", argument="blocks", value=left,
                                  reason="not the blocks of a request whose free hkv_vllm deferred")


@attrs.frozen
class FreeQueueView:
    """vLLM's free-block queue as far as hkv models it: how many blocks are free (not their order)."""

    pool: BlockPoolView

    @property
    def num_free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()
