"""The adaptive policy: its admission and order on hand-made inputs where each choice is known exactly, and the
second synthetic trace (sessions, one-shots) where it must not fall below LRU."""

from __future__ import annotations

import numpy as np

from hkv_core.replay import ReplayConfig, TraceRequest, replay
from hkv_core.replay.adaptive import DECLINED, AdaptivePolicy
from hkv_core.replay.synthetic import SessionTraceConfig, session_trace

CHATTY, ONE_SHOT = 1, 1000  # output tokens: bucket 1 and bucket 10


def policy(rows: int = 16) -> AdaptivePolicy:
    keys = np.zeros((rows, 2), np.uint64)
    keys[:, 0] = np.arange(100, 100 + rows)
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
    assert p.priority[4] == p.floor - DECLINED and p.order()[0] == 4  # at the cold end
    touch(p, CHATTY, 5)  # a new block of an admitted bucket goes in at floor + sqrt(1)
    assert p.priority[5] == p.floor + 1.0 and p.order().tolist() == [4, 5, 0, 1, 2, 3]


def test_the_ghost_table_counts_a_reuse_after_eviction_and_restores_uses() -> None:
    p = policy()
    touch(p, ONE_SHOT, 0)  # bucket 10: inserted 1
    p.forget(np.array([0], np.int32))
    assert p.floor == 1.0 and 100 in p.ghost  # the floor rises to the evicted priority
    p.keys[3, 0] = 100  # the same key comes back in another row
    touch(p, CHATTY, 3)
    assert p.reused[10] == 1 and p.inserted[10] == 1 and p.inserted[1] == 0  # a reuse of bucket 10's block
    assert p.uses[3] == 2 and p.priority[3] == 1.0 + np.sqrt(2.0)  # one use before, restored


def test_children_come_before_parents() -> None:
    p = policy()
    touch(p, CHATTY, 0, 1, 2)  # a chain, root first
    touch(p, CHATTY, 0)  # the root again: raised
    touch(p, CHATTY, 0, 1, 2)  # the whole chain again: the root had more uses, its children are raised to it
    order = p.order().tolist()
    assert order == [2, 1, 0] and p.priority[2] <= p.priority[1] <= p.priority[0]
    for row in (3, 5, 6):  # three one-shot blocks, never used again: bucket 10 reused 0 of 3
        touch(p, ONE_SHOT, row)
        p.forget(np.array([row], np.int32))
    touch(p, ONE_SHOT, 0, 1, 2, 4)  # a declined new tail under a cached chain: first to go, a leaf
    assert not p.admits(10) and p.order().tolist()[0] == 4


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
