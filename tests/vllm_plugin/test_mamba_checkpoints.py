"""In-kernel prefill checkpoints (vLLM's Mamba2 and KDA layers) through hkv_vllm.Scheduler (`hkv_vllm/checkpoints.py`).

A Mamba2 or KDA kernel leaves, besides the state at a step's end, the state at the step's last cache boundary in
the column before; vLLM's scheduler then does not end the prompt's last chunk at its last block boundary.  The
drives run Qwen3-Next-80B's group layout with its Mamba groups declaring checkpoints as Mamba2 layers do
(alignment 1), and a one-group layout of 16-token blocks whose 128-token chunks cross many blocks; a shadow of the
worker (`hkv_vllm.shadow`) writes each checkpoint where vLLM's own rule puts it and checks every state a step
starts from.  Printed: the cached tokens of stock vLLM and hkv (pytest -s).
"""

import pytest

from tests.vllm_plugin.conftest import HAS_VLLM, SKIP_REASON
from tests.vllm_plugin.test_qwen3_next import drive, layout, small_chats

pytestmark = pytest.mark.skipif(not HAS_VLLM, reason=SKIP_REASON)

SIZES = (30, 40, 60)  # blocks (20 leave stock vLLM itself stalled: a final chunk takes its checkpoint column too)


def test_checkpoints_hit_at_least_vllms_and_every_state_read_is_exact():
    lay = layout()
    for num_blocks in SIZES:
        stock = drive("stock", num_blocks, lay, checkpoints=1)
        ours = drive("hkv", num_blocks, lay, checkpoints=1)
        print(f"qwen3_next_80b with Mamba2 checkpoints, {num_blocks} blocks: cached tokens stock {stock[0]} "
              f"({stock[1]} preemptions), hkv {ours[0]} ({ours[1]}); checkpoints written {ours[3].checkpoints}")
        for run_ in (stock, ours):
            assert run_[3].wrong_reads == 0 and run_[3].wrong_writes == 0, run_[3].describe()
            assert run_[2] == 12 and run_[3].cached_reads > 0 and run_[3].checkpoints > 0
        assert ours[0] >= stock[0] > 0


@pytest.mark.parametrize("alignment", [1, 16])
def test_small_blocks_with_checkpoints_every_state_read_is_exact(alignment):
    for kind in ("stock", "hkv"):
        cached, _, finished, shadow = drive(kind, 100, mamba_groups=1, arrivals=small_chats(), checkpoints=alignment)
        assert shadow.wrong_reads == 0 and shadow.wrong_writes == 0, shadow.describe()
        assert finished == 12 and cached > 0 and shadow.checkpoints > 0


def test_a_checkpoint_the_kernel_never_wrote_is_caught(monkeypatch):
    """The broken variant: the kernel declares checkpoints but writes none (a backend that cannot export them);
    hkv's resume points at checkpoints then refer to columns no step wrote, and a hit there reads garbage."""
    from hkv_vllm import shadow as shadow_module

    monkeypatch.setitem(shadow_module.RULES, "MambaSpec", lambda spec, ratio: shadow_module.StateReads())
    shadow = drive("hkv", 60, layout(), checkpoints=1)[3]
    assert shadow.checkpoints == 0 and shadow.wrong_reads > 0


def test_the_checkpoint_column_is_taken_with_the_step():
    """A prompt's single chunk over blocks [0, 4) with a checkpoint at 3 blocks: the Mamba group's table is the
    null block twice, the checkpoint's column, the last column; one block per state group more is counted."""
    import hkv_vllm
    from hkv_vllm.drive import build_scheduler, make_request

    scheduler = build_scheduler(hkv_vllm.Scheduler, num_blocks=40, max_num_batched_tokens=256, mamba_groups=1,
                                mamba_checkpoints=1)
    manager = scheduler.kv_cache_manager
    request = make_request("r", list(range(100, 160)), max_tokens=4)
    assert manager.checkpoints.at(request, [[], []], 0, 60) == 48
    assert manager.checkpoints.at(request, [[], []], 16, 60) == 48
    assert manager.checkpoints.at(request, [[], []], 40, 60) == 0  # starts inside the checkpoint's block
    assert manager.checkpoints.at(request, [[], [1, 2, 3]], 0, 60) == 0  # the column is the request's already
    scheduler.add_request(request)
    scheduler.schedule()
    blocks = manager.get_block_ids("r")
    assert len(blocks[0]) == 4 and blocks[1][:2] == [0, 0] and 0 not in blocks[1][2:] and len(blocks[1]) == 4
    assert manager.hkv.request_tokens(manager.entries["r"].rid)[1] == 64
    assert manager.entries["r"].exports == [48]
