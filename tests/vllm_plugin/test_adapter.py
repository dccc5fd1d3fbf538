"""hkv_vllm's adapter on its own: layouts from vLLM's KV cache configs, refusals, keys, events, counts."""

import pytest

from tests.vllm_plugin.conftest import HAS_VLLM, SKIP_REASON

pytestmark = pytest.mark.skipif(not HAS_VLLM, reason=SKIP_REASON)


def kv_config(*specs, num_blocks=64):
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec([f"layer{i}"], s) for i, s in enumerate(specs)])


def full(block_size=16, dtype="float16", **extra):
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(block_size=block_size, num_kv_heads=2, head_size=64, dtype=getattr(torch, dtype),
                             **extra)


def manager(num_blocks=64, **kwargs):
    from hkv_vllm.manager import HkvKVCacheManager

    return HkvKVCacheManager(kv_config(full(), num_blocks=num_blocks), max_model_len=2048, scheduler_block_size=16,
                             hash_block_size=16, **kwargs)


def test_one_full_attention_group_is_one_pool_of_block_sized_pages():
    from hkv_vllm.layout import layout_from_kv_cache_config

    got = layout_from_kv_cache_config(kv_config(full(block_size=32), num_blocks=101))
    (pool,) = got.layout.pools
    assert pool.tokens_per_page == 32
    assert pool.dtype == "fp16"
    assert got.shared_pages == 100  # block 0 is vLLM's null block, hkv's NULL page


def test_mla_group_is_served():
    import torch
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    from hkv_vllm.layout import layout_from_kv_cache_config

    spec = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    assert layout_from_kv_cache_config(kv_config(spec)).layout.pools[0].tokens_per_page == 16


def sliding(window, block_size=16):
    import torch
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    return SlidingWindowSpec(block_size=block_size, num_kv_heads=2, head_size=64, dtype=torch.float16,
                             sliding_window=window)


def sliding_mla(window, bounded_replay=False):
    import torch
    from vllm.v1.kv_cache_interface import SlidingWindowMLASpec

    return SlidingWindowMLASpec(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16,
                                sliding_window=window, bounded_replay=bounded_replay)


def test_an_mla_sliding_window_group_without_replay_is_a_window():
    import torch
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    from hkv_vllm.layout import layout_from_kv_cache_config
    mla = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    got = layout_from_kv_cache_config(kv_config(mla, sliding_mla(128)))
    assert [g.window for g in got.groups] == [0, 128]
    assert got.layout.group(got.groups[1].pool.split(".")[0]).window_tokens == 128


def mamba(block_size=16, **fields):
    import torch
    from vllm.v1.kv_cache_interface import MambaSpec

    return MambaSpec(block_size=block_size, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align",
                     **fields)


def test_hybrid_groups_each_get_a_pool_and_share_one_block_space():
    from hkv_vllm.layout import layout_from_kv_cache_config

    got = layout_from_kv_cache_config(kv_config(full(), sliding(32), full(), sliding(64), num_blocks=42))
    # 41 blocks beside the null block, all of them open to every group: hkv page p of any pool is vLLM block p
    assert got.shared_pages == 41 and [g.window for g in got.groups] == [0, 32, 0, 64]
    assert len({g.pool for g in got.groups}) == 4  # a block is one group's: each group its own pool
    assert {g.pool: g.window for g in got.groups} == {p.group_name + "." + p.name.split(".")[-1]:
                                                      got.layout.group(p.group_name).window_tokens
                                                      for p in got.layout.pools}
    assert [g.block_id(p) for g in got.groups for p in (0, 1, 41)] == [0, 1, 41] * 4


@pytest.mark.parametrize(("specs", "feature", "match"), [
    (lambda: (full(), mamba(num_speculative_blocks=2)), "mamba_speculative_blocks", r"kv_cache_groups\[1\]"),
    (lambda: (full(), mamba(num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1), mamba()),
     "mamba_mixed_checkpoints", r"kv_cache_groups\[2\]: 16-token blocks, checkpoints none"),
    (lambda: (full(), mamba(block_size=24)), "kv_cache_groups[1]", "24-token blocks with 16-token hash"),
    (lambda: (sliding_mla(128, bounded_replay=True),), "swa_bounded_replay", "--no-swa-bounded-replay"),
    (lambda: (full(block_size=24), full()), "kv_cache_groups[0]", "a whole number of hash blocks"),
    (lambda: (full(dtype="int8"),), "kv_cache_dtype", "int8"),
    (lambda: (full(), sliding(64, block_size=24)), "kv_cache_groups[1]", "24-token blocks with 16-token hash"),
    (lambda: (), "kv_cache_groups", "no KV cache group"),
])
def test_unserved_groups_are_refused_by_name(specs, feature, match):
    from hkv_vllm import UnsupportedVllmConfig
    from hkv_vllm.layout import layout_from_kv_cache_config

    with pytest.raises(UnsupportedVllmConfig, match=match) as err:
        layout_from_kv_cache_config(kv_config(*specs()))
    assert err.value.feature == feature
    assert err.value.key == feature


def test_a_mamba_block_of_several_hash_blocks_is_served_and_fine_hits_with_it_refused():
    from hkv_vllm import UnsupportedVllmConfig
    from hkv_vllm.layout import layout_from_kv_cache_config

    got = layout_from_kv_cache_config(kv_config(full(), mamba(block_size=32)))  # vLLM's sub-block hits
    assert [(g.block_size, g.state) for g in got.groups] == [(16, False), (32, True)] and got.block_tokens == 16
    with pytest.raises(UnsupportedVllmConfig, match="fine hits") as err:
        layout_from_kv_cache_config(kv_config(full(block_size=32), mamba(block_size=32)), hash_block_size=16,
                                    fine_hits=True)
    assert err.value.feature == "mamba_fine_hits"


def test_groups_of_different_block_sizes_and_dtypes_each_get_their_own_pool():
    from hkv_vllm.layout import layout_from_kv_cache_config

    got = layout_from_kv_cache_config(kv_config(full(block_size=64), sliding(16), full(block_size=16, dtype="float32"),
                                                full(block_size=64), num_blocks=41), hash_block_size=16)
    pools = {p.name: p for p in got.layout.pools}
    assert [pools[g.pool].tokens_per_page for g in got.groups] == [64, 16, 16, 64]
    assert [pools[g.pool].dtype for g in got.groups] == ["fp16", "fp16", "fp32", "fp16"]
    assert len(pools) == 4  # one per group, even of one geometry: a block is one group's
    assert got.block_tokens == 16 and not got.uniform
    # one page per vLLM block, in bytes: 64 tokens x K and V x 2 heads x 64 x 2 bytes
    assert pools[got.groups[0].pool].page_bytes == 64 * 2 * 2 * 64 * 2


def test_a_hash_block_smaller_than_the_block_hits_on_whole_blocks():
    """vLLM's 16-token blocks hashed in 8-token blocks: hkv keys 8-token blocks and pages 16 tokens, so a hit
    ends where a vLLM block does, as vLLM's own does."""
    from hkv_vllm.drive import make_request
    from hkv_vllm.manager import HkvKVCacheManager

    m = HkvKVCacheManager(kv_config(full()), max_model_len=2048, scheduler_block_size=16, hash_block_size=8)
    first = make_request("a", list(range(60)), max_tokens=1, block_size=8)
    m.get_computed_blocks(first)
    assert len(m.allocate_slots(first, 60).blocks[0]) == 4
    first.num_computed_tokens = 60
    m.free(first)
    blocks, hit, _ = m.get_computed_blocks(make_request("b", list(range(60)) + [1], max_tokens=1, block_size=8))
    assert hit == 48 and len(blocks.blocks[0]) == 3  # 56 tokens are whole 8-token blocks; 48 end a 16-token one


def test_eagle_on_groups_of_different_block_sizes_hits_as_vllm():
    """Full attention in 32-token blocks, an 8-token window (the EAGLE group) in 8-token blocks: a hit lands on
    the LCM with the window's next block cached, as vLLM's own manager answers (96 of 128 tokens, 32 of 40)."""
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

    from hkv_vllm.drive import make_request
    from hkv_vllm.manager import HkvKVCacheManager

    window = SlidingWindowSpec(block_size=8, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=8)
    config = KVCacheConfig(num_blocks=100, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["full"], full(block_size=32)), KVCacheGroupSpec(["swa"], window, is_eagle_group=True)])
    hits = {}
    for cls in (KVCacheManager, HkvKVCacheManager):
        m = cls(config, max_model_len=2048, scheduler_block_size=32, hash_block_size=8, use_eagle=True)
        for n in (128, 40):
            prompt = [i // 8 for i in range(n)] + [999]
            first = make_request(f"a{n}", prompt, max_tokens=1, block_size=8)
            m.get_computed_blocks(first)
            assert m.allocate_slots(first, len(prompt)) is not None
            first.num_computed_tokens = len(prompt)
            m.free(first)
            hits[cls.__name__, n] = m.get_computed_blocks(make_request(f"b{n}", prompt, max_tokens=1,
                                                                       block_size=8))[1]
            assert m.reset_prefix_cache()
    assert hits == {("KVCacheManager", 128): 96, ("KVCacheManager", 40): 32,
                    ("HkvKVCacheManager", 128): 96, ("HkvKVCacheManager", 40): 32}


def test_an_invalid_retention_interval_is_refused_as_vllm_refuses_it():
    from dataclasses import replace

    from hkv_vllm.manager import HkvKVCacheManager

    config = replace(kv_config(full(), sliding(32)), prefix_cache_retention_interval=24)
    with pytest.raises(ValueError, match="multiple of scheduler_block_size"):
        HkvKVCacheManager(config, max_model_len=2048, scheduler_block_size=16, hash_block_size=16)


def test_chunked_local_attention_is_a_window_of_its_chunk_and_a_windowed_full_group_keeps_everything():
    import torch
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec

    from hkv_vllm.layout import layout_from_kv_cache_config

    chunked = ChunkedLocalAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16,
                                        attention_chunk_size=64)
    got = layout_from_kv_cache_config(kv_config(full(), chunked, full(sliding_window=128),
                                                full(attention_chunk_size=64)))
    assert [g.window for g in got.groups] == [0, 64, 0, 0]  # the chunk lies within the last 64 tokens


def test_no_block_beside_the_null_block_is_refused():
    from hkv_vllm import UnsupportedVllmConfig

    with pytest.raises(UnsupportedVllmConfig) as err:
        manager(num_blocks=1)
    assert err.value.feature == "num_blocks"


@pytest.mark.parametrize("kwargs", [dict(dcp_world_size=2), dict(pcp_world_size=2)])
def test_unserved_manager_options_are_refused(kwargs):
    from hkv_vllm import UnsupportedVllmConfig
    from hkv_vllm.manager import HkvKVCacheManager

    args = dict(max_model_len=2048, scheduler_block_size=16, hash_block_size=16) | kwargs
    with pytest.raises(UnsupportedVllmConfig):
        HkvKVCacheManager(kv_config(full()), **args)


def test_the_scheduler_builds_with_a_kv_connector_and_hkvs_manager(tmp_path):
    from vllm.config import KVTransferConfig

    import hkv_vllm
    from hkv_vllm.drive import build_scheduler
    from hkv_vllm.manager import HkvKVCacheManager

    built = build_scheduler(hkv_vllm.Scheduler, num_blocks=64)
    config = built.vllm_config
    config.scheduler_config.disable_hybrid_kv_cache_manager = True  # ExampleConnector serves one group
    config.kv_transfer_config = KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_both",
                                                 kv_connector_extra_config={"shared_storage_path": str(tmp_path)})
    for cls in (hkv_vllm.Scheduler, hkv_vllm.AsyncScheduler):
        scheduler = cls(vllm_config=config, kv_cache_config=built.kv_cache_config, block_size=16,
                        structured_output_manager=built.structured_output_manager)
        assert scheduler.connector is not None
        assert isinstance(scheduler.kv_cache_manager, HkvKVCacheManager)


def serve(m, request, num_computed=None):
    """One request through the adapter as the scheduler does: look up, allocate all, report computed, free."""
    blocks, hit, _ = m.get_computed_blocks(request)
    new = m.allocate_slots(request, request.num_tokens - hit, hit, blocks)
    request.num_computed_tokens = request.num_tokens if num_computed is None else num_computed
    m.free(request)
    return hit, new


def test_a_second_request_hits_what_the_first_computed_and_the_counts_follow():
    from hkv_vllm.drive import make_request

    m = manager()
    first = make_request("a", list(range(50)), max_tokens=1)
    blocks, hit, boundary = m.get_computed_blocks(first)
    assert (hit, boundary) == (0, 0)
    new = m.allocate_slots(first, 50)
    assert len(new.blocks[0]) == 4 and m.block_pool.get_num_free_blocks() == 63 - 4
    assert m.get_block_ids("a") == (new.get_block_ids()[0],)
    first.num_computed_tokens = 50
    m.free(first)
    assert m.block_pool.get_num_free_blocks() == 63 and m.usage == 0
    second = make_request("b", list(range(50)) + [7] * 10, max_tokens=1)
    blocks, hit, _ = m.get_computed_blocks(second)
    assert hit == 48  # three whole blocks; the fourth was partial
    assert blocks.get_block_ids()[0] == new.get_block_ids()[0][:3]


def test_written_means_computed_not_scheduled():
    """A block the scheduler allocated but whose tokens are not reported computed is no hit."""
    from hkv_vllm.drive import make_request

    m = manager()
    first = make_request("a", list(range(64)), max_tokens=1)
    m.get_computed_blocks(first)
    m.allocate_slots(first, 64)
    assert m.get_computed_blocks(make_request("b", list(range(64)) + [1], max_tokens=1))[1] == 0
    first.num_computed_tokens = 32
    m.cache_blocks(first, 32)  # vLLM reports 32 tokens written
    assert m.get_computed_blocks(make_request("c", list(range(64)) + [1], max_tokens=1))[1] == 32


def test_cache_salt_separates_tenants():
    from hkv_vllm.drive import make_request

    m = manager()
    serve(m, make_request("a", list(range(40)), max_tokens=1, cache_salt="tenant-a"))
    assert m.get_computed_blocks(make_request("b", list(range(40)), max_tokens=1, cache_salt="tenant-b"))[1] == 0
    assert m.get_computed_blocks(make_request("c", list(range(40)), max_tokens=1))[1] == 0
    assert m.get_computed_blocks(make_request("d", list(range(40)), max_tokens=1, cache_salt="tenant-a"))[1] == 32


def test_allocation_that_does_not_fit_returns_none_and_changes_nothing():
    from hkv_vllm.drive import make_request

    m = manager(num_blocks=5)  # 4 usable blocks
    big = make_request("a", list(range(100)), max_tokens=1)
    m.get_computed_blocks(big)
    before = (m.hkv.snapshot(), m.block_pool.get_num_free_blocks())
    assert m.allocate_slots(big, 100) is None
    assert (m.hkv.snapshot(), m.block_pool.get_num_free_blocks()) == before


def test_events_come_out_as_vllms_types():
    from vllm.distributed.kv_events import AllBlocksCleared, BlockStored

    from hkv_vllm.drive import make_request

    m = manager(enable_kv_cache_events=True)
    serve(m, make_request("a", list(range(40)), max_tokens=1))
    events = m.take_events()
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert [len(e.block_hashes) for e in stored] and sum(len(e.block_hashes) for e in stored) == 2
    assert all(e.block_size == 16 and e.group_idx == 0 and e.kv_cache_spec_kind for e in stored)
    assert m.reset_prefix_cache()
    assert any(isinstance(e, AllBlocksCleared) for e in m.take_events())


def test_reset_prefix_cache_refuses_while_a_request_holds_blocks():
    from hkv_vllm.drive import make_request

    m = manager()
    held = make_request("a", list(range(40)), max_tokens=1)
    m.get_computed_blocks(held)
    m.allocate_slots(held, 40)
    assert m.reset_prefix_cache() is False
    held.num_computed_tokens = 40
    m.free(held)
    assert m.reset_prefix_cache() is True
    assert m.get_computed_blocks(make_request("b", list(range(40)), max_tokens=1))[1] == 0


def test_slots_ahead_of_the_known_tokens_are_served_only_once_verified_and_written():
    """Lookahead (drafts, async scheduling's next token): blocks for positions not known yet, in hkv AHEAD
    objects; a second request hits only what is known and computed."""
    from hkv_vllm.drive import make_request

    m = manager()
    r = make_request("a", list(range(30)), max_tokens=8)
    m.get_computed_blocks(r)
    got = m.allocate_slots(r, 30, num_lookahead_tokens=4)  # positions 0..33: three blocks, 34 > 30 known
    assert len(got.blocks[0]) == 3
    assert m.hkv.request_tokens(m.entries["a"].rid) == (0, 48, 30)  # hkv: whole blocks, 18 positions ahead
    r.num_computed_tokens = 30
    for token in (100, 101, 102):  # the step verified three tokens
        r.append_output_token_ids(token)
    r.num_computed_tokens = 33
    assert m.allocate_slots(r, 1, num_lookahead_tokens=4).blocks == ((),)  # still inside the blocks it holds
    m.cache_blocks(r, 33)
    probe = make_request("b", list(range(30)) + [100, 101, 102, 7, 7], max_tokens=1)
    assert m.get_computed_blocks(probe)[1] == 32  # two whole blocks of known, written tokens; never position 33+
    m.free(r)


@pytest.mark.parametrize(("reserved", "fits"), [(4, True), (10, False)])
def test_reservations_constrain_this_allocation_not_the_whole_sequence(reserved, fits):
    """10 usable blocks, a 128-token prompt (8 blocks) admitted whole, one 16-token chunk allocated now."""
    from hkv_vllm.drive import make_request

    m = manager(num_blocks=11)
    request = make_request("chunk", list(range(128)), max_tokens=1)
    m.get_computed_blocks(request)
    got = m.allocate_slots(request, 16, full_sequence_must_fit=True, reserved_blocks=reserved)
    assert (got is not None) is fits


def test_eagle_hits_one_block_shorter_so_the_drafter_recomputes_it():
    from hkv_vllm.drive import make_request

    for eagle, expected in ((False, 48), (True, 32)):
        m = manager(use_eagle=eagle)
        first = make_request("a", list(range(50)), max_tokens=1)
        m.get_computed_blocks(first)
        m.allocate_slots(first, 50)
        first.num_computed_tokens = 50
        m.free(first)
        blocks, hit, _ = m.get_computed_blocks(make_request("b", list(range(50)) + [7], max_tokens=1))
        assert hit == expected and len(blocks.blocks[0]) == expected // 16
        assert m.coordinator.eagle_group_ids == ((0,) if eagle else ())


def test_a_sliding_window_groups_blocks_become_null_as_they_leave_the_window():
    """Full attention beside a 32-token window: after 96 tokens are committed the window group holds only the
    blocks the next token reads (the rest are the null block, still cached), and a hit resumes with them."""
    from hkv_vllm.drive import make_request
    from hkv_vllm.manager import HkvKVCacheManager

    m = HkvKVCacheManager(kv_config(full(), sliding(32), num_blocks=65), max_model_len=2048,
                          scheduler_block_size=16, hash_block_size=16)
    first = make_request("a", list(range(100)), max_tokens=1)
    m.get_computed_blocks(first)
    new = m.allocate_slots(first, 100)
    full_ids, window_ids = new.get_block_ids()
    assert len(full_ids) == len(window_ids) == 7
    assert not set(full_ids) & set(window_ids) and 0 not in full_ids + window_ids  # one group's each
    first.num_computed_tokens = 96
    m.cache_blocks(first, 96)
    full_now, window_now = m.get_block_ids("a")
    assert full_now == full_ids
    assert window_now[:4] == [0, 0, 0, 0] and window_now[4:] == window_ids[4:]  # [64, 96): the window at 96
    assert m.blocks.held == 7 + 3
    m.free(first)
    blocks, hit, _ = m.get_computed_blocks(make_request("b", list(range(96)) + [5] * 8, max_tokens=1))
    assert hit == 96
    got_full, got_window = blocks.get_block_ids()
    assert got_full == full_ids[:6] and got_window == [0, 0, 0, 0] + window_ids[4:6]


# ---------------------------------------------------------------- inputs vLLM's scheduler takes: never an hkv error


def both_schedulers(**kwargs):
    """vLLM's Scheduler with its own manager and with hkv's (`hkv_vllm.drive.build_scheduler` arguments)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    import hkv_vllm
    from hkv_vllm.drive import build_scheduler

    return {"stock": build_scheduler(Scheduler, **kwargs), "hkv": build_scheduler(hkv_vllm.Scheduler, **kwargs)}


def drive_both(prompts, *, steps=12, sample=None, **kwargs):
    """The same requests through both schedulers; per scheduler the steps and each request's final (status,
    computed tokens).  No exception may escape either."""
    from hkv_core.manager.invariants import check_invariants
    from hkv_vllm.drive import make_request, run

    out = {}
    for name, scheduler in both_schedulers(**kwargs).items():
        requests = [make_request(rid, prompt, max_tokens=max_tokens) for rid, prompt, max_tokens in prompts]
        extra = {} if sample is None else {"sample": sample}
        taken = run(scheduler, {0: requests}, max_steps=steps, **extra)
        out[name] = (taken, {r.request_id: (r.status.name, r.num_computed_tokens) for r in requests})
        if name == "hkv":
            assert check_invariants(scheduler.kv_cache_manager.hkv) == []
    return out


def test_an_empty_prompt_gets_no_hit_no_blocks_and_no_hkv_error():
    """vLLM's front ends refuse an empty prompt (vllm/v1/engine/input_processor.py, `_validate_prompt_len`:
    "The decoder prompt cannot be empty"); its scheduler cannot take one either: with prefix caching its own
    manager raises ValueError (`find_longest_cache_hit` slices to `num_tokens - 1 = -1` blocks), without it
    the scheduler's `assert num_new_tokens > 0` fails.  hkv's manager answers as vLLM's does without a lookup:
    no hit, nothing registered, so the scheduler stops at its own assertion, never at an hkv error; asked to
    allocate (vLLM's `test_allocate_with_lookahead` does, outside the scheduler) it answers None, nothing
    changed, where vLLM's gives the lookahead's blocks: hkv has no request without a token."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    from hkv_core.errors import HkvError
    from hkv_vllm.drive import make_request

    m, stock = manager(), KVCacheManager(kv_config(full()), max_model_len=2048, scheduler_block_size=16,
                                         hash_block_size=16, enable_caching=False)
    empty = make_request("empty", [], max_tokens=4)
    assert stock.get_computed_blocks(empty)[1:] == m.get_computed_blocks(empty)[1:] == (0, 0)
    assert m.get_computed_blocks(empty)[0].get_block_ids() == ([],)
    before = (m.hkv.snapshot(), m.block_pool.get_num_free_blocks())
    assert m.allocate_slots(empty, 3, num_lookahead_tokens=2) is None
    assert (m.hkv.snapshot(), m.block_pool.get_num_free_blocks()) == before and not m.entries
    assert len(stock.allocate_slots(empty, 3, num_lookahead_tokens=2).get_block_ids()[0]) == 1

    raised = {}
    for caching in (True, False):
        for name, scheduler in both_schedulers(num_blocks=64, enable_prefix_caching=caching).items():
            scheduler.add_request(make_request("empty", [], max_tokens=4))
            with pytest.raises(Exception) as err:
                scheduler.schedule()
            assert not isinstance(err.value, HkvError)
            raised[name, caching] = type(err.value)
            if name == "hkv":
                assert not scheduler.kv_cache_manager.entries  # nothing registered in hkv
    assert raised == {("stock", True): ValueError, ("stock", False): AssertionError,
                      ("hkv", True): AssertionError, ("hkv", False): AssertionError}


def test_a_prompt_longer_than_max_model_len_is_scheduled_as_vllm_schedules_it():
    """vLLM's front ends refuse such a prompt; its scheduler takes one: chunks up to max_model_len - 1 computed
    tokens, then nothing more, the request running (holding its blocks) until it is aborted, the others
    served.  hkv's manager knows the prompt's first max_model_len + 1 tokens (hkv's max_request_tokens) and
    schedules it exactly alike; a later request hits its first block in both."""
    prompts = [("long", list(range(200)), 4), ("short", list(range(20)), 2)]
    got = drive_both(prompts, num_blocks=64, max_model_len=128, max_num_batched_tokens=64)
    assert got["hkv"] == got["stock"]
    steps, final = got["hkv"]
    assert final == {"long": ("RUNNING", 127), "short": ("FINISHED_LENGTH_CAPPED", 21)}
    assert steps[1].cached == (("short", 16),)


def test_a_longer_prompt_within_one_step_is_computed_past_max_model_len_without_an_hkv_error():
    """With a token budget above max_model_len vLLM's scheduler computes the whole longer prompt in one step
    (past max_model_len) and finishes it; hkv knows and commits only its first max_model_len + 1 tokens.  Both
    finish; the short one resumes from the long one's first block in both, with vLLM in the same step (it
    hits the block the long one is scheduled to write), with hkv one step later, once it is written
    (docs/vllm.md, visibility)."""
    prompts = [("long", list(range(200)), 4), ("short", list(range(20)), 2)]
    got = drive_both(prompts, num_blocks=64, max_model_len=128, max_num_batched_tokens=512)
    assert [s.finished for s in got["stock"][0]] == [("long",), ("short",)]
    assert [s.finished for s in got["hkv"][0]] == [("long",), (), ("short",)]
    assert got["hkv"][1] == got["stock"][1]
    assert [s.cached for s in got["stock"][0]][0] == (("long", 0), ("short", 16))
    assert [s.cached for s in got["hkv"][0]][:2] == [(("long", 0),), (("short", 16),)]


@pytest.mark.parametrize("odd", [-1, -7, 2**31, 2**40])
def test_prompt_token_ids_outside_hkvs_range_are_served_and_hit_as_vllm_hits_them(odd):
    """vLLM hashes any int (its multimodal tests use -1 placeholders; with `skip_tokenizer_init` nothing
    checks a prompt's ids).  hkv keys only [0, 2**31): the adapter keys each other id as an item at its
    offset (the token set to 0), so a request hits exactly what it hits with vLLM's manager: the equal
    prompt's blocks, never those of a prompt with 0 or another id there."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    from hkv_vllm.drive import make_request

    first = [odd] * 20 + list(range(30))  # 50 tokens: three whole blocks
    hits = {}
    for name, m in {"stock": KVCacheManager(kv_config(full()), max_model_len=2048, scheduler_block_size=16,
                                            hash_block_size=16),
                    "hkv": manager()}.items():
        request = make_request("a", first, max_tokens=1)
        blocks, hit, _ = m.get_computed_blocks(request)
        m.allocate_slots(request, len(first), hit, blocks)
        request.num_computed_tokens = len(first)
        m.cache_blocks(request, len(first))
        m.free(request)
        hits[name] = [m.get_computed_blocks(make_request(rid, prompt + [5], max_tokens=1))[1]
                      for rid, prompt in (("same", first), ("zero", [0] * 20 + list(range(30))),
                                          ("other", [-3] * 20 + list(range(30))),
                                          ("late", [odd] * 16 + [0] * 4 + list(range(30))))]
    assert hits["hkv"] == hits["stock"] == [48, 0, 0, 16]
    got = drive_both([("odd", [odd] * 20 + list(range(20)), 4), ("short", list(range(20)), 2)], num_blocks=64)
    assert got["hkv"] == got["stock"]


def test_sampled_token_ids_outside_hkvs_range_are_served_and_never_cached():
    """A model never samples an id outside its vocabulary, but vLLM's manager would hash one: hkv knows the
    request's tokens before the first such id only; the rest are slots reserved ahead, written and never
    published.  The schedule is vLLM's; a later request hits only blocks before that token."""
    from hkv_vllm.drive import make_request

    got = drive_both([("a", list(range(40)), 20), ("b", list(range(100, 120)), 2)], steps=40, num_blocks=64,
                     sample=lambda req_id, pos: -1 if req_id == "a" and pos == 44 else 7)
    assert got["hkv"] == got["stock"]
    assert got["hkv"][1]["a"] == ("FINISHED_LENGTH_CAPPED", 59)
    m = manager()
    request = make_request("a", list(range(40)), max_tokens=20)
    m.get_computed_blocks(request)
    m.allocate_slots(request, 40)
    request.num_computed_tokens = 40
    for token in [7, 7, 7, 7, -1] + [7] * 15:  # positions 40..59
        request.append_output_token_ids(token)
        m.allocate_slots(request, 1)
        request.num_computed_tokens += 1
    m.free(request)
    probe = make_request("probe", list(range(40)) + [7, 7, 7, 7, -1] + [7] * 15 + [1], max_tokens=1)
    assert m.get_computed_blocks(probe)[1] == 32  # block 2 holds position 44: never cached
    assert m.get_computed_blocks(make_request("p2", list(range(40)) + [7] * 10, max_tokens=1))[1] == 32


def test_zeroing_after_a_failed_load_asks_nothing_of_hkv():
    """vLLM asks `record_blocks_for_zeroing` after a failed connector load on a mixed-precision cache; hkv never
    zeroes (each block id stays in its group's dtype, as for `take_new_block_ids`), so it changes nothing."""
    from hkv_vllm.drive import make_request

    m = manager()
    request = make_request("a", list(range(40)), max_tokens=1)
    m.get_computed_blocks(request)
    m.allocate_slots(request, 40)
    before = (m.hkv.snapshot(), m.get_block_ids("a"))
    assert m.record_blocks_for_zeroing("a", 16) is None
    assert (m.hkv.snapshot(), m.get_block_ids("a")) == before


# ---------------------------------------------------------------- prompt embeddings: part of the key, per block


def embeds_request(req_id, embeds, *, max_tokens, block_size=16):
    """A vLLM Request made from `prompt_embeds` (no token ids: vLLM stores `[0] * n`), built as
    `hkv_vllm.drive.make_request` builds one from token ids (vLLM's tests build theirs alike)."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    params = SamplingParams(ignore_eos=True, max_tokens=max_tokens)
    params.update_from_generation_config({}, 50256)
    return Request(request_id=req_id, prompt_token_ids=None, prompt_embeds=embeds, sampling_params=params,
                   pooling_params=None, block_hasher=get_request_block_hasher(block_size, sha256))


def embeds(n, seed, hidden=8):
    import torch

    return torch.randn(n, hidden, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def second_hit(first, second, *, steps=4, **kwargs):
    """`first` served to the end by vLLM's Scheduler with its own manager and with hkv's, then `second`
    arrives: the tokens each resumed `second` with (from the step that scheduled it), and hkv's invariants."""
    from hkv_core.manager.invariants import check_invariants
    from hkv_vllm.drive import run

    hits = {}
    for name, scheduler in both_schedulers(num_blocks=64, **kwargs).items():
        taken = run(scheduler, {0: [first()], steps: [second()]})
        assert first().request_id in {r for s in taken for r in s.finished}
        (hit,) = [n for s in taken for r, n in s.cached if r == second().request_id]
        hits[name] = hit
        if name == "hkv":
            assert check_invariants(scheduler.kv_cache_manager.hkv) == []
    return hits


def test_prompt_embeds_of_equal_length_and_different_values_never_share_a_block():
    """vLLM stores `[0] * n` as an embeddings request's token ids and keys each block by the digest of its
    embeddings too (`_gen_prompt_embeds_extra_hash_keys`); hkv's keys must as well, else two prompts of one
    length hit each other's KV (hkv hit 32 here where vLLM hits 0)."""
    a, b = embeds(56, 1), embeds(56, 2)
    hits = second_hit(lambda: embeds_request("a", a, max_tokens=2), lambda: embeds_request("b", b, max_tokens=2))
    assert hits == {"stock": 0, "hkv": 0}


def test_equal_prompt_embeds_share_their_whole_blocks():
    a = embeds(56, 1)
    hits = second_hit(lambda: embeds_request("a", a, max_tokens=2),
                      lambda: embeds_request("b", a.clone(), max_tokens=2))
    assert hits == {"stock": 48, "hkv": 48}  # three whole blocks; the last 8 tokens are computed


@pytest.mark.parametrize(("changed_row", "shared"), [(0, 0), (15, 0), (16, 16), (31, 16), (32, 32), (47, 32),
                                                     (48, 48), (55, 48)])
def test_prompt_embeds_equal_on_a_prefix_share_the_blocks_before_the_first_difference(changed_row, shared):
    """Every row's embedding keys the block holding it (its last row too, not only the block's first), and
    the blocks before it stay shared: vLLM's granularity, one digest per hash block."""
    a = embeds(56, 1)
    b = a.clone()
    b[changed_row, 3] += 1.0
    hits = second_hit(lambda: embeds_request("a", a, max_tokens=2), lambda: embeds_request("b", b, max_tokens=2))
    assert hits == {"stock": shared, "hkv": shared}


@pytest.mark.parametrize("embeds_first", [True, False])
def test_a_prompt_embeds_request_and_a_token_request_of_zeros_never_share(embeds_first):
    from hkv_vllm.drive import make_request

    a = embeds(56, 1)
    by_embeds = lambda: embeds_request("e", a, max_tokens=2)  # noqa: E731
    by_tokens = lambda: make_request("t", [0] * 56, max_tokens=2)  # noqa: E731
    hits = second_hit(*((by_embeds, by_tokens) if embeds_first else (by_tokens, by_embeds)))
    assert hits == {"stock": 0, "hkv": 0}


@pytest.mark.parametrize(("changed_row", "stock", "hkv"), [(None, 64, 64), (5, 0, 0), (20, 0, 16), (40, 32, 32),
                                                           (50, 32, 48)])
def test_with_fine_hits_prompt_embeds_key_each_of_hkvs_finer_blocks(changed_row, stock, hkv):
    """Fine hits: hkv's block (16 tokens) is finer than vLLM's hash block (32); each hkv block is keyed by its
    own rows' embeddings, so a hit stops at the hkv block holding the first difference, never past it."""
    a = embeds(70, 1)
    b = a.clone()
    if changed_row is not None:
        b[changed_row, 0] -= 1.0
    hits = second_hit(lambda: embeds_request("a", a, max_tokens=2, block_size=32),
                      lambda: embeds_request("b", b, max_tokens=2, block_size=32),
                      block_size=32, additional_config={"hkv": {"fine_hits": True}})
    assert hits == {"stock": stock, "hkv": hkv}


def test_prompt_embeds_items_are_vllms_block_digests_and_never_another_items():
    """One item per hkv block of the prompt, at its first token: the SHA-256 vLLM takes of the block's rows
    (the last block's 8 rows alone), with their dtype and shape, behind a tag no multimodal identifier
    (UTF-8) or out-of-range token item (0xff) starts with; the digests vLLM cached on the request are its
    own.  A request of token ids has none."""
    import hashlib

    import torch
    from vllm.v1.utils import tensor_data

    from hkv_vllm.drive import make_request
    from hkv_vllm.keys import EMBEDS_TAG, prompt_embeds_items, request_keys

    a = embeds(40, 1)
    request = embeds_request("a", a, max_tokens=1)
    items = prompt_embeds_items(request, 16)
    assert [o for o, _ in items] == [0, 16, 32]
    for (_, item), rows in zip(items, (a[:16], a[16:32], a[32:]), strict=True):
        assert item.startswith(EMBEDS_TAG) and item[0] == 0xfe
        assert item.endswith(hashlib.sha256(tensor_data(rows)).digest())
        assert f"torch.float32 ({len(rows)}, 8)".encode() in item
    request._prompt_embeds_per_block_hashes.clear()  # computed afresh: the same items
    assert prompt_embeds_items(request, 16) == items
    same_bytes = embeds_request("i", a.view(torch.int32), max_tokens=1)  # another dtype, the same bytes
    assert [i[-32:] for _, i in prompt_embeds_items(same_bytes, 16)] == [i[-32:] for _, i in items]
    assert prompt_embeds_items(same_bytes, 16) != items
    assert request_keys(request, 16) == (None, None, items)
    assert request_keys(make_request("t", [0] * 40, max_tokens=1), 16) == (None, None, ())
