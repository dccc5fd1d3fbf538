"""The index's eviction order (LruPolicy): exact order, stale entries, chunks, compaction, and the
invariant that guards its children-first promise."""

import numpy as np
import pytest

import hkv_core.manager.index.policy as policy_module
from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig, check_invariants
from hkv_core.manager.index.policy import LruPolicy


def ids(*values: int) -> np.ndarray:
    return np.array(values, np.int32)


def order(policy: LruPolicy) -> list[int]:
    return [int(b) for b in policy.order()]


def test_touch_puts_a_chain_at_the_back_deepest_first() -> None:
    lru = LruPolicy(16)
    a, b = ids(0, 1, 2), ids(3, 4)  # chains, root first
    lru.touch(a)
    lru.touch(b)
    assert order(lru) == [2, 1, 0, 4, 3]
    lru.touch(a[:2])  # a prefix used again: its old entries go stale
    assert order(lru) == [2, 4, 3, 1, 0]
    lru.touch(ids())  # an empty touch changes nothing
    assert order(lru) == [2, 4, 3, 1, 0] and lru.length == 7  # stale entries stay until a compaction


def test_forgotten_blocks_leave_the_order_and_stale_entries_are_skipped() -> None:
    lru = LruPolicy(16)
    lru.touch(ids(0, 1, 2, 3))
    lru.touch(ids(0, 1))
    lru.forget(ids(3, 2))
    assert order(lru) == [1, 0]
    assert np.concatenate(list(lru.chunks())).tolist() == [1, 0]
    assert lru.current(0, lru.length).tolist() == [False, False, False, False, True, True]


def test_chunks_walk_the_order_skip_stale_entries_and_move_the_head(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy_module, "QUEUE_CHUNK_ENTRIES", 2)
    monkeypatch.setattr(policy_module, "MAX_QUEUE_CHUNK_ENTRIES", 4)
    lru = LruPolicy(32)
    lru.touch(ids(*range(10)))  # queue: 9 8 ... 0
    lru.touch(ids(9, 8, 7))  # touched again as a chain rooted at 9: appended 7, 8, 9
    # the first three entries (9, 8, 7) are stale now; chunks of 2, then 4 entries (capped) skip them
    chunks = [c.tolist() for c in lru.chunks()]
    assert chunks == [[], [6, 5, 4], [3, 2, 1, 0], [7, 8, 9]]
    assert lru.head == 3, "leading stale entries are not screened again"
    assert order(lru) == [6, 5, 4, 3, 2, 1, 0, 7, 8, 9]
    lru.forget(ids(6, 5))
    next(lru.chunks())
    assert lru.head == 5 and order(lru)[:2] == [4, 3]


def test_compaction_keeps_the_current_entries_in_order() -> None:
    rows = 8
    lru = LruPolicy(rows)
    assert len(lru.queue) > rows, "every live block once, plus room for stale entries"
    lru.touch(ids(0, 1, 2, 3))
    lru.touch(ids(4, 5))
    lru.forget(ids(3))
    lengths = set()
    for _ in range(40):  # far more touches than the queue holds: compactions keep it bounded
        lru.touch(ids(0, 1))
        lengths.add(lru.length)
        assert lru.length <= len(lru.queue) and order(lru) == [2, 5, 4, 1, 0]
    assert min(lengths) < max(lengths), "the queue was compacted"
    lru.touch(ids(4, 5, 6, 7))
    current = [2, 1, 0, 7, 6, 5, 4]
    assert order(lru) == current
    assert lru.pos[current].tolist() == sorted(lru.pos[current].tolist())
    assert lru.pos[3] == -1 and int(lru.current(lru.head, lru.length).sum()) == len(current)


def test_a_compaction_lays_the_order_out_from_the_front() -> None:
    lru = LruPolicy(4)
    room = len(lru.queue)
    lru.touch(ids(0, 1, 2))
    while lru.length < room:  # fill the queue exactly: every touch of 0 leaves a stale entry behind
        lru.touch(ids(0))
    assert order(lru) == [2, 1, 0] and lru.length == room
    lru.touch(ids(1))  # no room: compact first (1's own old entry goes too), then append
    assert lru.head == 0 and lru.length == 3 and lru.queue[:3].tolist() == [2, 0, 1]
    assert order(lru) == [2, 0, 1] and lru.pos[[2, 0, 1]].tolist() == [0, 1, 2]


def test_clone_is_independent() -> None:
    lru = LruPolicy(8)
    lru.touch(ids(0, 1))
    twin = lru.clone()
    lru.touch(ids(0))
    twin.forget(ids(1))
    assert order(lru) == [1, 0] and order(twin) == [0]


def test_invariants_catch_an_order_with_parents_before_children(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: touch appends root first, so a parent would be evicted before its children."""
    real = LruPolicy.touch
    monkeypatch.setattr(LruPolicy, "touch", lambda self, chain: real(self, chain[::-1].copy()))
    m = CacheManager(Layout.from_preset("llama_full"), ManagerConfig(default_pool_pages=16, key_seed=0))
    rid = m.add_request(np.arange(48))
    m.allocate(rid, 48)
    m.commit(rid, 48)
    m.release(rid)
    broken = check_invariants(m)
    assert any(v.startswith("no_slot_leak") and "comes after its parent" in v for v in broken), broken


def test_the_real_order_passes_the_same_scenario() -> None:
    m = CacheManager(Layout.from_preset("llama_full"), ManagerConfig(default_pool_pages=16, key_seed=0))
    rid = m.add_request(np.arange(48))
    m.allocate(rid, 48)
    m.commit(rid, 48)
    chain = m.chain(rid)
    m.release(rid)
    assert check_invariants(m) == []
    assert m.core.index.policy.order().tolist() == chain[::-1]  # type: ignore[attr-defined]
