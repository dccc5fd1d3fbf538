"""What vLLM's scheduler and tests read of the manager's internals, as hkv_vllm answers it (hkv_vllm/views.py),
and out-of-window blocks dropped only below the tokens vLLM reports written."""

import pytest

from tests.vllm_plugin.conftest import HAS_VLLM, SKIP_REASON
from tests.vllm_plugin.test_adapter import kv_config, manager, serve, sliding

pytestmark = pytest.mark.skipif(not HAS_VLLM, reason=SKIP_REASON)


def window_manager():
    from hkv_vllm.manager import HkvKVCacheManager

    return HkvKVCacheManager(kv_config(sliding(32), num_blocks=64), max_model_len=2048, scheduler_block_size=16,
                             hash_block_size=16)


def nulls(m, req_id):
    group = m.coordinator.single_type_managers[0]
    return sum(1 for b in group.req_to_blocks[req_id] if b is group._null_block)


def allocated(m, tokens=96):
    from hkv_vllm.drive import make_request

    request = make_request("r", list(range(tokens)), max_tokens=4)
    assert m.allocate_slots(request, tokens) is not None
    request.num_computed_tokens = tokens  # scheduled: vLLM counts them computed before they are written
    return request


def test_out_of_window_blocks_leave_only_below_the_tokens_reported_written():
    m = window_manager()
    allocated(m)
    free = m.block_pool.get_num_free_blocks()
    m.remove_skipped_blocks("r", 0)  # the prefill is in flight: it still reads every block
    assert nulls(m, "r") == 0 and m.block_pool.get_num_free_blocks() == free
    m.remove_skipped_blocks("r", 48)  # 48 written: the window before token 48 starts in block 1
    assert nulls(m, "r") == 1
    m.remove_skipped_blocks("r", 96)
    assert nulls(m, "r") == 4  # blocks 4 and 5 hold the window before token 96
    assert m.block_pool.get_num_free_blocks() == free + 4  # cached, evictable: free as vLLM counts them
    assert m.coordinator.single_type_managers[0].num_cached_block["r"] == 6  # and the 96 written are published


def test_remove_skipped_blocks_of_an_unknown_request_changes_nothing():
    m = window_manager()
    m.remove_skipped_blocks("nobody", 96)
    assert m.block_pool.get_num_free_blocks() == 63


def test_the_block_pool_views_count_what_hkv_holds():
    from hkv_vllm.drive import make_request

    m = manager(num_blocks=64)
    pool = m.block_pool
    assert pool.null_block is pool.blocks[0] and pool.null_block.is_null
    assert m.coordinator.single_type_managers[0]._null_block is pool.null_block
    assert len(pool.blocks) == 64 and pool.free_block_queue.num_free_blocks == 63
    request = make_request("held", list(range(40)), max_tokens=1)
    blocks, hit, _ = m.get_computed_blocks(request)
    m.allocate_slots(request, 40, hit, blocks)
    assert pool.free_block_queue.num_free_blocks == pool.get_num_free_blocks() == 60
    assert sorted(b.block_id for b in pool.blocks if b.ref_cnt) == sorted(m.get_block_ids("held")[0])
    m.free(request)
    assert pool.free_block_queue.num_free_blocks == 63 and not any(b.ref_cnt for b in pool.blocks)
    with pytest.raises(TypeError):
        pool.blocks[1] = pool.blocks[2]  # read-only
    serve(m, make_request("again", list(range(40)), max_tokens=1))
    assert pool.free_block_queue.num_free_blocks == 63


def test_broken_variant_dropping_below_the_computed_tokens_frees_blocks_a_step_in_flight_reads(monkeypatch):
    from hkv_vllm.manager import HkvKVCacheManager

    def by_computed(self, request_id, processed_computed_tokens, num_prompt_tokens=None):
        entry = self.entries[request_id]
        self._commit_to(entry, 10**9)  # every known token, as if the step in flight had written its own

    monkeypatch.setattr(HkvKVCacheManager, "remove_skipped_blocks", by_computed)
    m = window_manager()
    allocated(m)
    m.remove_skipped_blocks("r", 0)
    assert nulls(m, "r") == 4  # the prefill in flight would read blocks vLLM may hand to another request


def test_hkv_is_given_only_written_tokens_so_a_streaming_session_can_replace_its_last_sampled_one():
    from hkv_vllm.drive import make_request

    m = manager()
    request = make_request("s", list(range(31)), max_tokens=4)
    m.get_computed_blocks(request)
    m.allocate_slots(request, 31)
    request.num_computed_tokens = 31
    request.append_output_token_ids(7)  # sampled, not yet written
    m.allocate_slots(request, 1)
    assert m.hkv.request_tokens(m.entries["s"].rid)[2] == 31  # hkv knows the 31 written, not the sampled 7
    del request._all_token_ids[31:]  # vLLM's session update: the last sampled token is dropped,
    request._all_token_ids.extend([100, 101])  # the next input follows
    request.num_computed_tokens = 33
    m.free(request)
    other = make_request("o", list(range(31)) + [100, 101, 5], max_tokens=1)
    assert m.get_computed_blocks(other)[1] == 32  # keyed on the tokens vLLM wrote: 0..30, 100
