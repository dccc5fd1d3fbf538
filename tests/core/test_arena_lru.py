"""The arena's LRU queue: order, stale entries, compaction, and the invariant that guards it."""

import numpy as np
import pytest

from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig, check_invariants
from hkv_core.manager.arena import MIN_QUEUE, BlockArena


def chain(arena: BlockArena, length: int, parent: int = -1) -> np.ndarray:
    keys = np.random.default_rng(length).integers(0, 2**63, (length, 2)).astype(np.uint64)
    return arena.add_chain(keys, parent, 0)


def queue(arena: BlockArena) -> list[int]:
    """Current entries, front (evicted first) to back."""
    start, end = arena.lru_head, arena.lru_len
    return arena.lru_block[start:end][arena.current(start, end)].tolist()


def test_touch_puts_a_chain_at_the_back_deepest_first() -> None:
    arena = BlockArena(1, 0, 0)
    a, b = chain(arena, 3), chain(arena, 2)
    arena.touch(a)
    arena.touch(b)
    assert queue(arena) == [*a[::-1].tolist(), *b[::-1].tolist()]
    arena.touch(a[:2])  # a prefix used again: its old entries go stale
    assert queue(arena) == [int(a[2]), *b[::-1].tolist(), int(a[1]), int(a[0])]


def test_dropped_blocks_leave_the_queue_and_compaction_keeps_the_order() -> None:
    arena = BlockArena(1, 0, 0)
    a = chain(arena, 4)
    arena.touch(a)
    arena.drop_many(a[::-1][:2])  # the two deepest blocks
    assert queue(arena) == [int(a[1]), int(a[0])]
    for _ in range(MIN_QUEUE):  # many touches force compaction (and growth)
        arena.touch(a[:2])
    assert arena.lru_len <= len(arena.lru_block) and queue(arena) == [int(a[1]), int(a[0])]
    assert arena.lru_len < MIN_QUEUE


def test_drop_many_refuses_a_block_with_children() -> None:
    arena = BlockArena(1, 0, 0)
    a = chain(arena, 3)
    with pytest.raises(AssertionError, match="leaves"):
        arena.drop_many(a[:1])


def test_invariants_catch_a_queue_out_of_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: touch appends root first, so a parent would be evicted before its children."""
    real = BlockArena.touch
    monkeypatch.setattr(BlockArena, "touch", lambda self, blocks: real(self, blocks[::-1]))
    m = CacheManager(Layout.from_preset("llama_full"), ManagerConfig(default_pool_pages=16, seed=0))
    rid = m.add_request(np.arange(48))
    m.allocate(rid, 48)
    m.commit(rid, 48)
    m.release(rid)
    broken = check_invariants(m)
    assert any("no_slot_leak" in v and "comes after its parent" in v for v in broken), broken
