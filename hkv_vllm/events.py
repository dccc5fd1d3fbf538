"""hkv's KV cache events as vLLM's own event types (`vllm.distributed.kv_events`).

hkv's block events already carry vLLM's field names; here they become
vLLM's msgspec structs, one per KV cache group (hkv stores and evicts a
block's state in every group at once), annotated with the group's index and
spec kind as vLLM's manager annotates its own.  Hashes are hkv's 128-bit block keys (16 bytes).
hkv's resume-point events have no vLLM counterpart and are not forwarded
(a full-attention group resumes at every cached block); lost events are
logged.
"""

from __future__ import annotations

import logging
from typing import Any

from hkv_core import events as hkv_events

logger = logging.getLogger("hkv_vllm")


def vllm_events(events: list[hkv_events.KVEvent], kv_cache_config: Any) -> list[Any]:
    """vLLM events for hkv's `take_events()` records, in order."""
    from vllm.distributed import kv_events as ve
    from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind, get_kv_cache_spec_sliding_window

    groups = [(i, g.kv_cache_spec) for i, g in enumerate(kv_cache_config.kv_cache_groups)]
    kinds = [(i, get_kv_cache_spec_kind(spec).value, get_kv_cache_spec_sliding_window(spec)) for i, spec in groups]
    out: list[Any] = []
    for event in events:
        if isinstance(event, hkv_events.BlockStored):
            out.extend(ve.BlockStored(
                block_hashes=list(event.block_hashes), parent_block_hash=event.parent_block_hash,
                token_ids=list(event.token_ids), block_size=event.block_size, lora_id=event.lora_id,
                medium=event.medium, lora_name=event.lora_name, group_idx=i, kv_cache_spec_kind=kind,
                kv_cache_spec_sliding_window=window) for i, kind, window in kinds)
        elif isinstance(event, hkv_events.BlockRemoved):
            out.extend(ve.BlockRemoved(block_hashes=list(event.block_hashes), medium=event.medium, group_idx=i)
                       for i, _, _ in kinds)
        elif isinstance(event, hkv_events.AllBlocksCleared):
            out.append(ve.AllBlocksCleared())
        elif isinstance(event, hkv_events.EventsLost):
            logger.warning("hkv dropped %d KV cache events (ManagerConfig.max_pending_events)", event.count)
    return out
