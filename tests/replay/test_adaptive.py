"""The adaptive policy: its admission, order and shadow caches on hand-made inputs where each choice is known
exactly, and the second synthetic trace (sessions, one-shots) where it must not fall below LRU."""

from __future__ import annotations

import numpy as np

from hkv_core.manager.index.adaptive import BETAS, DECLINED, AdaptivePolicy
from hkv_core.manager.index.shadow import SAMPLE_MODULUS, Shadows
from hkv_core.replay import ReplayConfig, TraceRequest, replay
from hkv_core.replay.synthetic import SessionTraceConfig, session_trace

CHATTY, ONE_SHOT = 1, 1000  # output tokens: bucket 1 and bucket 10


def policy(rows: int = 16) -> AdaptivePolicy:
    """Row r holds key (100 + r, 16 r << 32): every key distinct and every key in the shadows' sample."""
    keys = np.zeros((rows, 2), np.uint64)
    keys[:, 0] = np.arange(100, 100 + rows)
    keys[:, 1] = (np.arange(rows, dtype=np.uint64) * np.uint64(SAMPLE_MODULUS)) << np.uint64(32)
    return AdaptivePolicy(rows, keys)


def touch(p: AdaptivePolicy, output_tokens: int, *rows: int) -> None:
    p.hint(output_tokens)
    p.touch(np.array(rows, np.int32))


def test_a_bucket_reused_less_than_half_as_often_as_the_average_is_declined() -> None:
    p = policy()
    for row in (0, 1, 2, 3):  # four chatty blocks, each used twice: bucket 1 reused 4 of 4
        touch(p, CHATTY, row)
        touch(p, CHATTY, row)
    touch(p, ONE_SHOT, 4)  # bucket 10: 1 inserted, none reused: 1/3 against half of 5/7 (0.357)
    assert not p.admits(10) and p.admits(1)
    assert (p.priority[:, 4] == 8 - DECLINED).all() and p.order()[0] == 4  # at the cold end, every candidate
    touch(p, CHATTY, 5)  # a new block of an admitted bucket goes in at the clock (no uses: no bonus)
    assert (p.priority[:, 5] == 9.0).all()
    # block 0 was used once before its second touch at clock 1, first seen at 0: rate 1 / (1 + 1/16)
    assert np.allclose(p.priority[:, 0], 1.0 + np.array(BETAS) * 16 / (1 + 1 / 16))
    assert p.chosen == 0 and p.order().tolist() == [4, 0, 1, 2, 3, 5]  # no shadow hit yet: recency alone
    p.chosen = 1
    assert p.order().tolist() == [4, 5, 0, 1, 2, 3]  # with a bonus, blocks used twice outrank a new one


def test_the_ghost_table_counts_a_reuse_after_eviction_and_restores_uses() -> None:
    p = policy()
    touch(p, ONE_SHOT, 0)  # bucket 10: inserted 1
    p.forget(np.array([0], np.int32))
    assert p.ghost[100] == (1, 10, 0)  # uses, the inserting bucket, first seen at clock 0
    p.keys[3, 0] = 100  # the same key comes back in another row
    touch(p, CHATTY, 3)
    assert p.reused[10] == 1 and p.inserted[10] == 1 and p.inserted[1] == 0  # a reuse of bucket 10's block
    assert p.uses[3] == 2 and p.first[3] == 0  # one use before, restored; the age counts from the first sight
    assert np.allclose(p.priority[:, 3], 1.0 + np.array(BETAS) * 16 * 1 / (1 + 1 / 16))


def test_children_come_before_parents_under_every_candidate() -> None:
    p = policy()
    touch(p, CHATTY, 0, 1, 2)  # a chain, root first
    touch(p, CHATTY, 0)  # the root again: raised
    touch(p, CHATTY, 0, 1, 2)  # the whole chain again: the root had more uses, its children are raised to it
    for k in range(len(BETAS)):
        p.chosen = k
        assert p.order().tolist() == [2, 1, 0] and p.priority[k, 2] <= p.priority[k, 1] <= p.priority[k, 0]
    for row in (3, 5, 6):  # three one-shot blocks, never used again: bucket 10 reused 0 of 3
        touch(p, ONE_SHOT, row)
        p.forget(np.array([row], np.int32))
    touch(p, ONE_SHOT, 0, 1, 2, 4)  # a declined new tail under a cached chain: first to go, a leaf
    assert not p.admits(10)
    for k in range(len(BETAS)):
        p.chosen = k
        assert p.order().tolist()[0] == 4


def test_sampling_is_a_function_of_the_key_alone() -> None:
    keys = np.arange(64, dtype=np.uint64) << np.uint64(32) | np.uint64(7)  # upper halves 0..63
    shadows = Shadows(2, 1600)
    assert shadows.sampled(keys).tolist() == [i % 16 == 0 for i in range(64)]
    assert Shadows(3, 50).sampled(keys[::-1]).tolist() == shadows.sampled(keys)[::-1].tolist()
    assert shadows.capacity == 100 and Shadows(2, 5).capacity == 1  # capacity / 16, at least one block


def test_a_shadow_keeps_the_highest_priorities_and_counts_hits() -> None:
    s = Shadows(2, 2, modulus=1)  # two candidates, two blocks each
    s.access([1, 2], np.array([[0.0, 1.0], [5.0, 1.0]]))  # candidate 1 values key 1 above key 2
    s.access([3], np.array([[2.0], [2.0]]))  # full: candidate 0 drops key 1, candidate 1 drops key 2
    assert set(s.held[0]) == {2, 3} and set(s.held[1]) == {1, 3}
    s.access([2], np.array([[4.0], [4.0]]))  # candidate 0 holds key 2: a hit; candidate 1 drops key 3 for it
    s.access([1], np.array([[3.0], [3.0]]))  # candidate 1 holds key 1: a hit; candidate 0 drops key 3 for it
    assert s.hits == [1, 1] and s.best() == 0  # the earlier candidate wins ties
    assert set(s.held[0]) == set(s.held[1]) == {1, 2} and s.held[1][1][0] == 5.0  # a hit keeps the higher priority
    s.hits = [1, 3]
    assert s.best() == 1


def test_the_shadows_choose_a_bonus_when_a_reused_block_is_pushed_out_by_one_shots() -> None:
    # H is used again every third touch, between two one-shots; the shadows hold 2 blocks (32 rows / 16).
    # Recency alone (beta 0) evicts H before each return; any bonus keeps it over the newer one-shots.
    p = policy(rows=32)
    touch(p, CHATTY, 0)
    touch(p, CHATTY, 0)
    for i in range(10):
        touch(p, CHATTY, 1 + 2 * i)
        touch(p, CHATTY, 2 + 2 * i)
        touch(p, CHATTY, 0)
    assert p.shadows.hits[0] == 1 and p.shadows.hits[1:] == [11] * (len(BETAS) - 1)
    assert p.chosen == 1 and p.order().tolist()[-1] == 0  # the smallest bonus that wins: H is kept longest


def test_the_shadows_choose_recency_when_an_old_favourite_is_not_used_again() -> None:
    # A is used 8 times, then never again; B and C alternate.  With a bonus A holds one of the shadows' two
    # slots for a while and B and C evict each other; recency alone keeps B and C.
    p = policy(rows=32)
    for _ in range(8):
        touch(p, CHATTY, 0)
    for _ in range(20):
        touch(p, CHATTY, 1)
        touch(p, CHATTY, 2)
    hits = p.shadows.hits
    assert hits[0] == 7 + 38 and all(h < hits[0] for h in hits[1:]) and p.chosen == 0
    assert int(p.picks.sum()) == 48


def replay_hits(policy_name: str) -> tuple[int, ...]:
    # P and Q: two blocks each, used twice (chatty); X1..X4: one-shots; then P and Q again.  Blocks of 4 tokens,
    # 6 pages.  LRU lets the one-shots push P and Q out; adaptive declines X1..X4 (bucket 10 reused 0 of 1..4
    # against bucket 1's 4 of 4), so each one-shot evicts the one before it and P and Q hit at the end.
    def req(i: int, ids: tuple[int, ...], out: int) -> TraceRequest:
        return TraceRequest(timestamp=i, input_length=4 * len(ids) + 1, output_length=out,
                            hash_ids=(*ids, 1000 + i))
    shapes = [((1, 2), CHATTY), ((1, 2), CHATTY), ((3, 4), CHATTY), ((3, 4), CHATTY),
              ((5,), ONE_SHOT), ((6,), ONE_SHOT), ((7,), ONE_SHOT), ((8,), ONE_SHOT),
              ((1, 2), CHATTY), ((3, 4), CHATTY)]
    trace = [req(i, ids, out) for i, (ids, out) in enumerate(shapes)]
    result = replay(trace, ReplayConfig(block_tokens=4, capacity_tokens=24, policy=policy_name))
    return tuple(h // 4 for h in result.hits)


def test_adaptive_keeps_reused_chains_that_lru_loses_to_one_shots() -> None:
    assert replay_hits("lru") == (0, 2, 0, 2, 0, 0, 0, 0, 0, 0)
    assert replay_hits("adaptive") == (0, 2, 0, 2, 0, 0, 0, 0, 2, 2)


def test_session_trace_shape_and_adaptive_not_below_lru() -> None:
    config = SessionTraceConfig(sessions=40, one_shots=200, duration_s=100.0, turn_gap_s=15.0)
    trace = session_trace(config, seed=1)
    assert trace == session_trace(config, seed=1) and trace != session_trace(config, seed=2)
    assert len(trace) > 240 and all(a.timestamp <= b.timestamp for a, b in zip(trace, trace[1:], strict=False))
    roots = {r.hash_ids[0] for r in trace}
    assert len(roots) <= config.system_prompts  # every prompt starts with a shared system prompt
    for blocks in (100, 400):
        runs = {p: replay(trace, ReplayConfig(capacity_tokens=blocks * 512, policy=p)).block_hit_rate
                for p in ("lru", "adaptive", "belady")}
        assert runs["lru"] <= runs["adaptive"] <= runs["belady"], runs
