"""Resume points behind a running request: evictable, after everything released, the least shared and the
oldest first.

The eviction order places a block where its request last released it, and a
running request's own new blocks join it only at its release; the points
those live chains hold (kept as the request computed) are still units of
eviction: a point is only window pages and snapshots the request has
passed.  They go last, as in use now; among them first those fewer running
requests share (a point every running request shares - a system prompt - is
where the next one arrives), then the shallowest (a window passed those
first).  A block on a live chain never goes, and neither does a point whose
tail snapshot a lease pins.
"""

from __future__ import annotations

import numpy as np

from hkv_core.layout import EngineGroup, engine_layout
from hkv_core.manager import CacheManager, ManagerConfig, check_invariants
from hkv_core.manager.index import NO_POINT


def _manager(window_pages: int) -> CacheManager:
    """Full attention and an 8-token window, both in 4-token pages (a point holds the two window pages before
    it), with `window_pages` window pages."""
    groups = [EngineGroup(window_tokens=w, tokens_per_page=4, kv_dtype="fp16", num_kv_heads=1, head_dim=8)
              for w in (0, 8)]
    layout, pools = engine_layout(groups, name="e", block_tokens=4, alignment_bytes=16, source="test")
    return CacheManager(layout, ManagerConfig(pool_pages={pools[0]: 64, pools[1]: window_pages}, max_requests=4,
                                              max_request_tokens=256, retain_every_blocks=1, key_seed=1))


def _points_at(m: CacheManager, rid: int) -> list[int]:
    """Token positions of the points kept on the request's chain."""
    chain = np.array(m.chain(rid))
    return [4 * (i + 1) for i, b in enumerate(chain) if m.core.index.blocks.point[b] != NO_POINT]


def _start(m: CacheManager, tokens: list[int]) -> int:
    rid = m.add_request(tokens)
    m.acquire(rid, m.match(rid))
    m.allocate(rid, len(tokens) - m.request_tokens(rid)[0])
    m.commit(rid, len(tokens) - m.request_tokens(rid)[0])
    return rid


def test_a_running_requests_oldest_points_go_when_another_needs_the_pages() -> None:
    m = _manager(window_pages=10)
    a = _start(m, list(range(32)))  # 8 blocks, a point at each: the window holds its last two pages
    assert _points_at(m, a) == [4, 8, 12, 16, 20, 24, 28, 32]
    b = _start(m, list(range(100, 124)))  # another prompt: its pages come from a's oldest points
    assert _points_at(m, a)[-1] == 32 and _points_at(m, a)[0] > 4  # the latest stays, the oldest went
    assert m.stats["evicted_points"] > 0 and m.stats["evicted_blocks"] == 0  # a's blocks are live
    assert check_invariants(m) == []
    m.release(b)
    # a resumes at its last point after a preemption (release and re-add)
    m.release(a)
    again = m.add_request(list(range(32)) + [1])
    assert m.match(again).tokens == 32
    assert check_invariants(m) == []


def test_a_point_running_requests_share_outlives_their_own() -> None:
    m = _manager(window_pages=14)
    shared = list(range(16))
    a = _start(m, shared + list(range(500, 516)))
    b = _start(m, shared + list(range(600, 616)))  # resumes at 16 (a's point there) and shares it
    assert m.request_tokens(b)[0] == 32
    c = _start(m, list(range(900, 924)))  # needs pages: the unshared points behind a and b go first
    assert 16 in _points_at(m, a) and 16 in _points_at(m, b)
    assert _points_at(m, a)[-1] == 32 and _points_at(m, b)[-1] == 32
    assert check_invariants(m) == []
    for r in (a, b, c):
        m.release(r)
    assert check_invariants(m) == []
