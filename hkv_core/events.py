"""KV cache events: what the prefix index stored and removed, for cache-aware routers.

A router that spreads requests over many serving instances wants to send a
request where its prefix is cached.  Each instance tells it what it holds
with a stream of events, in order (`CacheManager.take_events()`); the
router replays them into its own map of hashes.  The block events carry
vLLM's field names (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`) so
that routers written for vLLM's KV events read them; hkv adds its own:

- `ResumePointStored` / `ResumePointRemoved`: on a hybrid model (sliding
  windows, compressor tails) a block is a hit only where a resume point is
  kept, so a router that counts blocks alone would overrate an instance.
  A point sits at the end of the block `block_hash` names, at token
  `position_tokens` of the prompt.
- `EventsLost`: the manager keeps at most `ManagerConfig.max_pending_events`
  records between two `take_events` calls; beyond that the oldest are
  dropped and this event says how many, so the subscriber knows its view
  is stale (it should treat the instance as holding nothing it did not
  hear about since).

Hashes are the manager's 128-bit block keys as 16 bytes (two little-endian
64-bit words).  Keys of two instances are comparable only when both use the
same `ManagerConfig.key_seed` (docs/manager.md says what sharing a seed costs).
This module depends on nothing else in hkv: a subscriber can import it alone.
"""

from __future__ import annotations

import attrs

__all__ = ["MEDIUM_DEVICE", "AllBlocksCleared", "BlockRemoved", "BlockStored", "EventsLost", "KVEvent",
           "ResumePointRemoved", "ResumePointStored"]

MEDIUM_DEVICE = "GPU"  # vLLM's name for the accelerator's memory (host and disk tiers will add "CPU", "STORAGE")


@attrs.frozen(kw_only=True)
class BlockStored:
    """Consecutive blocks entered the index: each the parent of the next, the first a child of
    `parent_block_hash` (None: the first block of a prompt); `token_ids` are their tokens, in order."""

    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None  # an integer adapter id
    lora_name: str | None = None  # a named adapter
    medium: str = MEDIUM_DEVICE


@attrs.frozen(kw_only=True)
class BlockRemoved:
    """Blocks left the index (evicted); a block leaves only after every block below it."""

    block_hashes: tuple[bytes, ...]
    medium: str = MEDIUM_DEVICE


@attrs.frozen(kw_only=True)
class AllBlocksCleared:
    """Every block and resume point left the index (`CacheManager.clear_cache`)."""

    medium: str = MEDIUM_DEVICE


@attrs.frozen(kw_only=True)
class ResumePointStored:
    """A resume point was kept at the end of block `block_hash`: a hit may resume at `position_tokens`."""

    block_hash: bytes
    position_tokens: int
    medium: str = MEDIUM_DEVICE


@attrs.frozen(kw_only=True)
class ResumePointRemoved:
    """The resume points at the end of these blocks were dropped (the blocks may stay)."""

    block_hashes: tuple[bytes, ...]
    medium: str = MEDIUM_DEVICE


@attrs.frozen(kw_only=True)
class EventsLost:
    """`count` records of events were dropped before anyone took them (see the module docstring)."""

    count: int


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared | ResumePointStored | ResumePointRemoved | EventsLost
