"""The prefix index's shortcuts stay exact, and the checks that guard them can fail.

- Matched chains are remembered by their last block until a block drop; a
  memo kept across a drop would hand out recycled rows (shown by breaking it).
- A live chain's blocks get eviction-order entries only when its request
  releases; `check_invariants` reports an indexed block off every live chain
  with no entry (shown by a release that forgets to order its chain).
"""

from __future__ import annotations

import numpy as np
import pytest

from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig, check_invariants
from hkv_core.manager.index.blocks import BlockTable
from hkv_core.manager.index.prefix_index import PrefixIndex


def serve(m: CacheManager, tokens: np.ndarray) -> int:
    """Add, match + acquire, allocate the rest, commit and release; the hit length."""
    rid = m.add_request(tokens)
    hit = m.match(rid)
    m.acquire(rid, hit)
    m.allocate(rid, len(tokens) - hit.tokens)
    m.commit(rid, len(tokens) - hit.tokens)
    m.release(rid)
    return hit.tokens


def recycled_rows_scenario(m: CacheManager) -> tuple[np.ndarray, np.ndarray]:
    """A two-block chain is matched (and remembered by its last row), evicted, and its rows reused: its
    last row now ends another two-block chain.  Returns (what match gives for that chain, what its keys
    say)."""
    bt = m.layout.block_tokens
    a, g = np.arange(2 * bt), np.arange(2 * bt) + 1000
    serve(m, a)  # rows 0, 1
    probe = m.add_request(np.concatenate([a, [7]]))
    assert m.match(probe).tokens == 2 * bt  # remembers a's chain by row 1
    m.release(probe)
    serve(m, g)  # rows 2, 3
    assert m.evict(2) == 2 and m.index_counts()["blocks"] == 2  # a's blocks go (least recently used)
    serve(m, np.arange(bt) + 3000)  # one new block: row 0
    serve(m, np.concatenate([g[:bt], np.arange(bt) + 5000]))  # g's head (row 2), then a new block: row 1
    rid = m.add_request(np.concatenate([g[:bt], np.arange(bt) + 5000, [9]]))
    hit = m.match(rid)
    keys = m.core.requests.by_rid[rid].keys[:len(hit.block_ids)]
    return np.asarray(hit.block_ids), m.core.index.lookup(keys)


def test_a_remembered_chain_is_forgotten_at_a_drop() -> None:
    m = CacheManager(Layout.from_preset("llama_full"), ManagerConfig(default_pool_pages=16, key_seed=0))
    found, truth = recycled_rows_scenario(m)
    assert len(found) > 0 and found.tolist() == truth.tolist()
    assert check_invariants(m) == []


def test_a_memo_kept_across_drops_hands_out_recycled_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    real = BlockTable.drop

    def drop_keeping_memo(self: BlockTable, rows: np.ndarray) -> None:
        chains = dict(self.chains)
        real(self, rows)
        self.chains.update(chains)  # broken: remembered chains survive the drop

    monkeypatch.setattr(BlockTable, "drop", drop_keeping_memo)
    m = CacheManager(Layout.from_preset("llama_full"), ManagerConfig(default_pool_pages=16, key_seed=0))
    found, truth = recycled_rows_scenario(m)
    assert found.tolist() != truth.tolist(), "the stale memo must show: the shortcut is what keeps it exact"


def test_invariants_catch_a_released_chain_left_out_of_the_eviction_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    m = CacheManager(Layout.from_preset("tiny_v4"), ManagerConfig(default_pool_pages=32, key_seed=0))
    serve(m, np.arange(40))
    assert check_invariants(m) == []
    monkeypatch.setattr(PrefixIndex, "touch", lambda self, chain: None)  # broken: release orders nothing
    serve(m, np.arange(40) + 500)
    assert any("no eviction-order entry" in v for v in check_invariants(m))
