"""vLLM's sub-block state hits through hkv_vllm.Scheduler: a Mamba block of four hash blocks (docs/vllm_mamba.md).

vLLM's scheduler over one full-attention and one Mamba group of 64-token blocks, hashed in 16-token blocks, so it
ends each prompt's last chunk at its last hash boundary inside a state block; a shadow of the worker
(`hkv_vllm.shadow`) runs the block copies hkv hands vLLM and checks every state a step starts from.
"""

import pytest

from tests.vllm_plugin.conftest import HAS_VLLM, SKIP_REASON

pytestmark = pytest.mark.skipif(not HAS_VLLM, reason=SKIP_REASON)


def chats():
    """Two users, three turns each, a turn arriving once the user's previous one finished: a 200-token system
    prompt, 70 new tokens a turn (prompt tails 256, 336, 400: inside a 64-token block twice), 20 decoded."""
    from hkv_vllm.drive import make_request

    arrivals: dict[int, list] = {}
    for user in range(2):
        prompt = list(range(1000, 1200))
        for turn in range(3):
            prompt = prompt + [5000 + 1000 * user + 100 * turn + i for i in range(70)]
            arrivals.setdefault(40 * turn + user, []).append(make_request(f"u{user}t{turn}", list(prompt),
                                                                          max_tokens=20))
    return arrivals


def drive(kind, num_blocks, patch=None):
    from vllm.v1.core.sched.scheduler import Scheduler

    import hkv_vllm
    from hkv_vllm.drive import build_scheduler, run
    from hkv_vllm.shadow import ShadowWorker

    scheduler = build_scheduler(Scheduler if kind == "stock" else hkv_vllm.Scheduler, num_blocks=num_blocks,
                                block_size=16, block_sizes=(64,), max_num_batched_tokens=128, max_model_len=2048,
                                mamba_groups=1)
    if patch is not None:
        patch(scheduler.kv_cache_manager)
    shadow = ShadowWorker.for_scheduler(scheduler)
    steps = run(scheduler, chats(), shadow=shadow)
    hits = [n for s in steps for _, n in s.cached]
    return hits, sum(len(s.finished) for s in steps), shadow, scheduler


def test_hits_inside_a_state_block_read_exactly_their_state():
    hits, finished, shadow, scheduler = drive("hkv", 60)
    assert scheduler.mamba_partial_cache_hit and scheduler.kv_cache_manager.sub_block_hits
    assert shadow.wrong_reads == 0 and shadow.wrong_writes == 0, shadow.describe()
    assert finished == 6 and shadow.copies > 0 and any(h % 64 for h in hits), hits
    stock = drive("stock", 60)[0]
    print(f"sub-block drive, 60 blocks: cached tokens stock {sum(stock)}, hkv {sum(hits)}")


def test_broken_variant_a_point_on_a_block_the_producer_writes_again_is_caught():
    """Without the adapter's rule (commit at a step's end inside a block only when the next step leaves it) and the
    snapshot, hkv keeps the point on the producer's block, which vLLM's append-only table makes it write again."""
    def no_snapshots(manager):
        manager.state_block = 1  # every position a block end: no deferred commit, no snapshot

    shadow = drive("hkv", 60, no_snapshots)[2]
    assert shadow.wrong_reads > 0
