"""Fine hits: hkv resumes inside a vLLM block, and vLLM's worker copies the partial block on write."""

import pytest

from tests.vllm_plugin.conftest import HAS_VLLM, SKIP_REASON

pytestmark = pytest.mark.skipif(not HAS_VLLM, reason=SKIP_REASON)


def manager(fine_hits=True, num_blocks=64):
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    from hkv_vllm.manager import HkvKVCacheManager

    spec = FullAttentionSpec(block_size=32, num_kv_heads=1, head_size=8, dtype=torch.float32)
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    return HkvKVCacheManager(config, max_model_len=2048, scheduler_block_size=32, hash_block_size=32,
                             fine_hits=fine_hits)


def computed(m, req_id, prompt):
    """A request whose whole prompt vLLM computed and finished."""
    from hkv_vllm.drive import make_request

    request = make_request(req_id, prompt, max_tokens=1, block_size=32)
    blocks, hit, _ = m.get_computed_blocks(request)
    m.allocate_slots(request, len(prompt) - hit, hit, blocks)
    request.num_computed_tokens = len(prompt)
    return request


@pytest.mark.parametrize(("fine", "want"), [(True, 48), (False, 32)])
def test_a_hit_lands_on_every_16_token_block_only_with_fine_hits(fine, want):
    from hkv_vllm.drive import make_request

    m = manager(fine_hits=fine)
    m.free(computed(m, "a", list(range(50))))
    _, hit, _ = m.get_computed_blocks(make_request("b", list(range(50)) + [7] * 20, max_tokens=1, block_size=32))
    assert hit == want


def test_the_partial_block_is_copied_on_write_and_held_until_vllm_returns_it():
    from hkv_vllm.drive import make_request

    m = manager()
    first = computed(m, "a", list(range(50)))
    a_ids = m.get_block_ids("a")[0]
    m.free(first)
    assert m.take_kv_cache_block_copies() == ([], [])
    second = make_request("b", list(range(50)) + [7] * 20, max_tokens=1, block_size=32)
    blocks, hit, _ = m.get_computed_blocks(second)
    assert hit == 48 and [b.block_id for b in blocks.blocks[0]] == a_ids  # the partial block is a's second
    free_before = m.block_pool.get_num_free_blocks()
    assert m.allocate_slots(second, 70 - 48, 48, blocks) is not None
    b_ids = m.get_block_ids("b")[0]
    assert b_ids[0] == a_ids[0] and b_ids[1] not in a_ids and len(b_ids) == 3  # block 1: a private copy
    copies, retained = m.take_kv_cache_block_copies()
    assert [(c.src_block_id, c.dst_block_id) for c in copies] == [(a_ids[1], b_ids[1])]
    assert [b.block_id for b in retained] == [a_ids[1], b_ids[1]] and all(b.ref_cnt > 0 for b in retained)
    assert m.block_pool.get_num_free_blocks() == free_before - 4  # a's two (the source held), the copy, a new one
    assert m.take_kv_cache_block_copies() == ([], [])  # each copy handed out once
    m.block_pool.free_blocks(retained)  # the copy ran: hkv's plan completes, the source is free to evict
    assert retained[0].ref_cnt == 0 and retained[1].ref_cnt == 1  # the copy stays b's
    with pytest.raises(Exception, match="not the blocks"):
        m.block_pool.free_blocks(retained)  # twice is refused
    second.num_computed_tokens = 70
    m.free(second)
    _, hit, _ = m.get_computed_blocks(make_request("c", list(range(50)) + [7] * 20 + [1], max_tokens=1,
                                                   block_size=32))
    assert hit == 64  # b's copy of the partial block was published with the rows b wrote after it


def resumed(m, req_id="b"):
    """A request resuming at 48 of a's 50 computed tokens, its partial second block copied on write."""
    from hkv_vllm.drive import make_request

    m.free(computed(m, "a", list(range(50))))
    request = make_request(req_id, list(range(50)) + [7] * 20, max_tokens=1, block_size=32)
    blocks, hit, _ = m.get_computed_blocks(request)
    assert hit == 48 and m.allocate_slots(request, 70 - 48, 48, blocks) is not None
    return request


def test_a_request_freed_before_the_scheduler_took_its_copy_publishes_nothing_of_it():
    from hkv_vllm.drive import make_request

    m = manager()
    second = resumed(m)
    second.num_computed_tokens = 48  # preempted before any step ran
    m.free(second)
    assert m.take_kv_cache_block_copies() == ([], [])  # the copy is dropped, never run
    assert not m.copies.open and not m.hkv.core.plans and m.blocks.held == 0
    _, hit, _ = m.get_computed_blocks(make_request("c", list(range(50)) + [7] * 20, max_tokens=1, block_size=32))
    assert hit == 48  # a's blocks still serve; nothing of b's uncopied block was published


def test_tokens_written_past_the_hit_settle_the_copy_before_vllm_returns_its_blocks():
    """Under deferred frees vLLM returns the copy's blocks only after the step completes, possibly after it
    reports the request's tokens written: hkv's plan completes at that report, and the commit publishes."""
    from hkv_vllm.drive import make_request

    m = manager()
    second = resumed(m)
    _, retained = m.take_kv_cache_block_copies()
    second.num_computed_tokens = 70
    m.cache_blocks(second, 70)  # the step ran (its copy first): 70 tokens written
    assert not m.copies.open and m.hkv.request_tokens(m.entries["b"].rid)[0] == 70  # committed
    assert all(b.ref_cnt > 0 for b in retained)  # still held for vLLM
    m.block_pool.free_blocks(retained)
    m.free(second)
    assert m.blocks.held == 0
    _, hit, _ = m.get_computed_blocks(make_request("c", list(range(50)) + [7] * 20 + [1], max_tokens=1,
                                                   block_size=32))
    assert hit == 64


def test_a_commit_of_a_copy_never_handed_to_vllm_waits_for_it():
    """No step could have run a copy the scheduler never took: its block holds garbage, so nothing past the hit is
    committed (and nothing raises into vLLM's scheduler) until vLLM takes the copy and reports the step written."""
    m = manager()
    second = resumed(m)
    second.num_computed_tokens = 70
    m.cache_blocks(second, 70)
    assert m.hkv.request_tokens(m.entries["b"].rid)[0] == 48
    copies, _ = m.take_kv_cache_block_copies()
    assert len(copies) == 1
    m.cache_blocks(second, 70)
    assert m.hkv.request_tokens(m.entries["b"].rid)[0] == 70


def test_the_scheduler_takes_the_option_from_vllms_plugin_config_and_refuses_unknown_ones():
    from vllm.v1.core.sched.scheduler import Scheduler

    import hkv_vllm
    from hkv_vllm import UnsupportedVllmConfig
    from hkv_vllm.drive import build_scheduler

    sched = build_scheduler(hkv_vllm.Scheduler, num_blocks=64, additional_config={"hkv": {"fine_hits": True}})
    assert sched.kv_cache_manager.fine_hits
    assert not build_scheduler(hkv_vllm.Scheduler, num_blocks=64).kv_cache_manager.fine_hits
    for bad in ({"fine_hit": True}, {"fine_hits": 1}):
        with pytest.raises(UnsupportedVllmConfig) as err:
            build_scheduler(hkv_vllm.Scheduler, num_blocks=64, additional_config={"hkv": bad})
        assert err.value.feature == f"additional_config.hkv.{next(iter(bad))}"
    assert build_scheduler(Scheduler, num_blocks=64, additional_config={"hkv": {"fine_hits": True}})


def test_chats_through_the_scheduler_hit_at_least_as_much_as_stock_and_every_copy_is_settled():
    import functools

    from vllm.v1.core.sched.scheduler import Scheduler

    import hkv_vllm
    from hkv_vllm.drive import build_scheduler, run
    from tests.vllm_plugin.test_scheduler_differential import conversations

    chats = functools.partial(conversations, block_size=32)
    stock = run(build_scheduler(Scheduler, num_blocks=200, block_size=32), chats())
    fine_sched = build_scheduler(hkv_vllm.Scheduler, num_blocks=200, block_size=32,
                                 additional_config={"hkv": {"fine_hits": True}})
    fine = run(fine_sched, chats())
    hits = [sum(n for s in steps for _, n in s.cached) for steps in (stock, fine)]
    assert hits == [32 * 3 + 32 * 4 + 64 * 4, 32 * 3 + 48 * 4 + 80 * 4], hits  # turns resume at 48 and 80, not 32, 64
    assert any(n % 32 for s in fine for _, n in s.cached)  # some hits end inside a block
    assert sum(len(s.finished) for s in fine) == 12
    m = fine_sched.kv_cache_manager
    assert not m.copies.held and not m.copies.pending and not m.copies.open and not m.hkv.core.plans
    assert m.blocks.held == 0


def test_under_memory_pressure_copies_evictions_and_preemptions_leave_nothing_held():
    """Five usable 32-token blocks: requests are preempted and resumed, cached blocks evicted, partial blocks
    copied on write - every request finishes, every copy's plan completes, no block stays held."""
    import functools

    import hkv_vllm
    from hkv_vllm.drive import build_scheduler, run
    from tests.vllm_plugin.test_scheduler_differential import conversations

    sched = build_scheduler(hkv_vllm.Scheduler, num_blocks=6, block_size=32, max_num_batched_tokens=32,
                            additional_config={"hkv": {"fine_hits": True}})
    steps = run(sched, functools.partial(conversations, block_size=32)())
    m = sched.kv_cache_manager
    assert sum(len(s.finished) for s in steps) == 12 and sum(len(s.preempted) for s in steps) >= 1
    assert m.hkv.stats["copies"] >= 1 and m.hkv.stats["evictions"] >= 1
    assert not m.copies.held and not m.copies.pending and not m.copies.open and not m.hkv.core.plans
    assert m.blocks.held == 0


def test_fine_hits_are_refused_where_a_hit_would_end_inside_a_compressed_state():
    """DeepSeek-V4's compressed groups as vLLM lays them out: one state per 128 tokens (HCA); hits every 16
    tokens would end inside a state whose compressor rows vLLM keeps elsewhere - refused by name."""
    import torch
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MLAAttentionSpec

    from hkv_vllm import UnsupportedVllmConfig
    from hkv_vllm.manager import HkvKVCacheManager

    spec = MLAAttentionSpec(block_size=256, num_kv_heads=1, head_size=512, dtype=torch.bfloat16,
                            tokens_per_state=128)
    config = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    args = dict(max_model_len=2048, scheduler_block_size=256, hash_block_size=256)
    assert HkvKVCacheManager(config, **args).vllm_layout.block_tokens == 256  # whole blocks: whole states
    with pytest.raises(UnsupportedVllmConfig, match="inside a state") as err:
        HkvKVCacheManager(config, **args, fine_hits=True)
    assert err.value.feature == "kv_cache_groups[0]"
