"""The shadow worker (hkv_vllm/shadow.py) proves every KV read of the model-free drive, for stock vLLM and hkv.

Each step's scheduler output runs through a shadow of vLLM's worker KV memory
that records, per block and slot, which token prefix and position was written
there; every position a scheduled token attends to below its step's first
token must hold its own prefix's record.  With the differential check's
workloads no read is wrong and reads of cached prefixes happen; broken
variants of hkv's adapter and of vLLM itself, each a monkeypatch here, are
caught.
"""

import functools

import pytest

from tests.vllm_plugin.conftest import HAS_VLLM, SKIP_REASON

pytestmark = pytest.mark.skipif(not HAS_VLLM, reason=SKIP_REASON)

FINE = {"hkv": {"fine_hits": True}}
WORKLOADS = {  # the differential check's (and test_fine_hits.py's) configurations: build_scheduler's arguments
    "full": dict(num_blocks=2000),
    "full-13-blocks": dict(num_blocks=14, max_num_batched_tokens=32),
    "full+sw": dict(num_blocks=4000, windows=(0, 32)),
    "full+sw-27-blocks": dict(num_blocks=27, max_num_batched_tokens=32, windows=(0, 32)),
    "full+sw+full+sw64": dict(num_blocks=8000, windows=(0, 32, 0, 64)),
    "sw+sw64": dict(num_blocks=4000, windows=(32, 64)),
    "full32+sw16": dict(num_blocks=4000, windows=(0, 16), block_sizes=(32, 16)),
    "full64+sw16+full16": dict(num_blocks=6000, windows=(0, 16, 0), block_sizes=(64, 16, 16)),
    "full32+sw16-19-blocks": dict(num_blocks=19, max_num_batched_tokens=32, windows=(0, 16), block_sizes=(32, 16)),
    "fine-hits": dict(num_blocks=200, block_size=32, additional_config=FINE),
    "fine-hits-5-blocks": dict(num_blocks=6, block_size=32, max_num_batched_tokens=32, additional_config=FINE),
}


def shadowed(kind, arrivals=None, asynchronous=False, **kwargs):
    """Run the chats (or `arrivals()`) through stock vLLM's scheduler or hkv's (their async variants with
    `asynchronous`) with a shadow worker: the steps and the shadow."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    import hkv_vllm
    from hkv_vllm.drive import build_scheduler, run
    from hkv_vllm.shadow import ShadowWorker
    from tests.vllm_plugin.test_scheduler_differential import conversations

    classes = (AsyncScheduler, hkv_vllm.AsyncScheduler) if asynchronous else (Scheduler, hkv_vllm.Scheduler)
    scheduler = build_scheduler(classes[kind != "stock"], **kwargs)
    shadow = ShadowWorker.for_scheduler(scheduler)
    arrivals = arrivals or functools.partial(conversations, block_size=kwargs.get("block_size", 16))
    return run(scheduler, arrivals(), shadow=shadow), shadow


@pytest.mark.parametrize("kind", ["stock", "hkv"])
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_every_read_holds_what_its_own_prefix_wrote_there(kind, workload):
    kwargs = WORKLOADS[workload]
    steps, shadow = shadowed(kind, **kwargs)
    assert shadow.wrong_reads == 0 and shadow.wrong_writes == 0, shadow.describe()
    assert sum(len(s.finished) for s in steps) == 12
    hits = sum(n for s in steps for _, n in s.cached)
    assert hits > 0 and shadow.cached_reads > 0, shadow.summary  # hits' prefixes were read, and proved
    if 0 in kwargs.get("windows", (0,)):  # a full-attention group reads every hit position at least once
        assert shadow.cached_reads >= hits, shadow.summary
    assert shadow.resumes == sum(len(s.preempted) for s in steps)  # each resumption replaced the block table
    if kind == "hkv" and "additional_config" in kwargs:
        assert shadow.copies > 0 and shadow.copied_reads > 0, shadow.summary  # fine hits read copied blocks


@pytest.mark.parametrize("kind", ["stock", "hkv"])
@pytest.mark.parametrize("workload", ["full", "full-13-blocks"])
def test_async_scheduling_as_the_drive_runs_it(kind, workload):
    """vLLM's AsyncScheduler as `drive.run` steps it (each step's output in before the next schedule, so every
    scheduled token is known; an overlapped drive would be refused: hkv_vllm/shadow.py)."""
    steps, shadow = shadowed(kind, asynchronous=True, **WORKLOADS[workload])
    assert shadow.wrong_reads == 0 and shadow.wrong_writes == 0, shadow.describe()
    assert shadow.cached_reads >= sum(n for s in steps for _, n in s.cached) > 0, shadow.summary


def test_a_hit_on_blocks_written_in_the_same_step_is_exact():
    """Stock vLLM lets a request resume from blocks another request writes in the same step (docs/vllm.md,
    visibility): the worker writes the whole batch's KV before attention reads, and so does the shadow."""
    from hkv_vllm.drive import make_request

    def twins():
        prompt = list(range(64))
        return {0: [make_request("a", prompt, max_tokens=2), make_request("b", prompt, max_tokens=2)]}

    steps, shadow = shadowed("stock", twins, num_blocks=100)
    assert dict(steps[0].cached)["b"] == 48
    assert shadow.wrong_reads == 0 and shadow.wrong_writes == 0 and shadow.cached_reads >= 48, shadow.describe()
    assert shadow.same_step_reads >= 48  # b's hit is KV a writes in this very step


def test_read_rules_follow_vllms_windows_and_refuse_what_they_do_not_model():
    import torch
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        CircularBufferSpec,
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowMLASpec,
        SlidingWindowSpec,
    )

    from hkv_vllm.shadow import ReadRule, compress_ratio, read_rule

    shape = dict(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
    assert read_rule(FullAttentionSpec(**shape)).reads(48, 50) == range(0, 48)
    assert read_rule(SlidingWindowSpec(**shape, sliding_window=32)).reads(48, 50) == range(17, 48)  # t reads t-31..t
    assert read_rule(SlidingWindowSpec(**shape, sliding_window=32)).reads(20, 50) == range(0, 20)
    assert read_rule(FullAttentionSpec(**shape, sliding_window=8)).reads(48, 49) == range(41, 48)
    assert read_rule(ChunkedLocalAttentionSpec(**shape, attention_chunk_size=32)).reads(40, 70) == range(32, 40)
    assert read_rule(ChunkedLocalAttentionSpec(**shape, attention_chunk_size=32)).reads(64, 70) == range(64, 64)
    assert ReadRule().locate(37, 16) == (2, 5)
    with pytest.raises(NotImplementedError, match="outside align mode"):
        read_rule(MambaSpec(block_size=16, shapes=((1,),), dtypes=(torch.float32,)))
    assert type(read_rule(MambaSpec(block_size=16, shapes=((1,),), dtypes=(torch.float32,),
                                    mamba_cache_mode="align"))).__name__ == "StateReads"
    with pytest.raises(NotImplementedError, match="bounded replay"):
        read_rule(SlidingWindowMLASpec(**shape, sliding_window=32, bounded_replay=True))
    # DeepSeek-V4's compressed MLA group: an entry per 4 tokens, written at the 4th, read by every later token
    mla = read_rule(MLAAttentionSpec(**{**shape, "block_size": 256}, tokens_per_state=4))
    assert mla.reads(16, 20) == range(3, 16, 4) and mla.locate(263, 256) == (1, 1)
    assert [mla.writes(p) for p in range(8)] == [False, False, False, True] * 2
    # V4.1's ring (compression ratio 2): position p in slot p % 8 of the one block; the open pair's first row
    ring = read_rule(CircularBufferSpec(**{**shape, "block_size": 8}), compress_ratio=2)
    assert ring.reads(13, 14) == range(12, 13) and ring.reads(14, 20) == range(14, 14)
    assert ring.locate(13, 8) == (0, 5) and ring.wraps and not mla.wraps
    assert compress_ratio([FullAttentionSpec(**shape), MLAAttentionSpec(**shape, tokens_per_state=2)]) == 2


# ---------------------------------------------------------------------------------------------- broken variants


def _drop_one_block_early(mp):
    """hkv's adapter nulls one sliding-window block more than hkv dropped (a block the window still reads)."""
    from hkv_vllm.manager import HkvKVCacheManager

    drop = HkvKVCacheManager._drop_out_of_window

    def early(self, entry):
        drop(self, entry)
        tables = self.hkv.tables(entry.rid)
        for group in self.windowed:
            g, table = group.group_id, list(tables[group.pool])
            dropped = next((i for i, page in enumerate(table) if page), len(table))
            if 0 < dropped < len(entry.blocks[g]) - 1 and not entry.blocks[g][dropped].is_null:
                self.blocks.to_null(entry, g, dropped)
                entry.live[g] = dropped + 1

    mp.setattr(HkvKVCacheManager, "_drop_out_of_window", early)


def _window_one_block_short(mp):
    """hkv serves every sliding window one block narrower than the model reads."""
    import hkv_vllm.layout

    window = hkv_vllm.layout._window
    mp.setattr(hkv_vllm.layout, "_window", lambda i, spec: window(i, spec) and window(i, spec) - spec.block_size)


def _groups_share_block_ids(mp):
    """The adapter maps a window group's hkv pages one block id off: it hands the window blocks another group
    holds (one block in two groups)."""
    from hkv_vllm.layout import GroupPool

    mp.setattr(GroupPool, "block_ids", lambda self, pages: [int(p) + 1 if self.window and p else int(p)
                                                            for p in pages])


def _user_blind(tokens):
    """The chats' tokens with the user left out (conversations(): 2000 + 100 * user + 10 * turn + i)."""
    return [t if t < 2000 else 2000 + t % 100 for t in tokens]


def _hkv_keys_collide(mp):
    """hkv keys every user's messages alike: a hit's blocks hold another user's prefix."""
    from hkv_core.manager import CacheManager

    add = CacheManager.add_request
    mp.setattr(CacheManager, "add_request", lambda self, tokens, **kw: add(self, _user_blind(tokens), **kw))


def _hit_ids_reversed(mp):
    """The adapter hands vLLM a hit's block ids in the wrong order."""
    from hkv_vllm.manager import HkvKVCacheManager

    hit_ids = HkvKVCacheManager._hit_ids
    mp.setattr(HkvKVCacheManager, "_hit_ids", lambda self, hit: [ids[::-1] for ids in hit_ids(self, hit)])


def _copies_dropped(mp):
    """Fine hits' partial-block copies never reach the worker (e2e's `--fault no-copy`)."""
    from hkv_vllm import e2e_run
    from hkv_vllm.manager import HkvKVCacheManager

    init = HkvKVCacheManager.__init__

    def without_copies(self, *args, **kwargs):
        init(self, *args, **kwargs)
        e2e_run.drop_copies(self)

    mp.setattr(HkvKVCacheManager, "__init__", without_copies)


def _vllm_hashes_collide(mp):
    """Stock vLLM hashes every user's messages alike: its hits hold another user's prefix."""
    from vllm.v1.core import kv_cache_utils

    hash_block = kv_cache_utils.hash_block_tokens
    mp.setattr(kv_cache_utils, "hash_block_tokens",
               lambda fn, parent, tokens, extra=None: hash_block(fn, parent, _user_blind(tokens), extra))


def _vllm_window_one_block_short(mp):
    """Stock vLLM's sliding-window manager skips (frees, nulls) one block more than the window lets go."""
    from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager

    skipped = SlidingWindowManager.get_num_skipped_tokens
    mp.setattr(SlidingWindowManager, "get_num_skipped_tokens", lambda self, n: skipped(self, n + self.block_size))


BROKEN = {  # id -> (the patch, scheduler, workload, what the first wrong read finds: one of)
    "hkv-drops-a-window-block-early": (_drop_one_block_early, "hkv", "full+sw", "the null block"),
    "hkv-window-one-block-short": (_window_one_block_short, "hkv", "full+sw-27-blocks", "the null block"),
    "hkv-block-in-two-groups": (_groups_share_block_ids, "hkv", "full32+sw16", ("group", "never written")),
    "hkv-stale-hit-keys-collide": (_hkv_keys_collide, "hkv", "full", "another prefix's KV"),
    "hkv-stale-hit-ids-reversed": (_hit_ids_reversed, "hkv", "full", "position"),
    "hkv-fine-hit-copy-dropped": (_copies_dropped, "hkv", "fine-hits", ("never written", "position")),
    "vllm-stale-hit-hashes-collide": (_vllm_hashes_collide, "stock", "full", "another prefix's KV"),
    "vllm-window-one-block-short": (_vllm_window_one_block_short, "stock", "full+sw-27-blocks", "the null block"),
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_broken_variant_is_caught(broken, monkeypatch):
    patch, kind, workload, why = BROKEN[broken]
    patch(monkeypatch)
    _, shadow = shadowed(kind, **WORKLOADS[workload])
    assert shadow.wrong_reads > 0, shadow.summary
    first = shadow.wrong[0]
    assert any(w in first.why for w in ((why,) if isinstance(why, str) else why)), shadow.describe()
