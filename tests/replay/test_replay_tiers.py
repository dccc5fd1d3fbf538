"""The replay's host and disk tiers on hand-made traces: what each tier holds and serves is known exactly."""

from __future__ import annotations

import pytest

from hkv_core import Layout
from hkv_core.errors import ConfigError
from hkv_core.replay import ReplayConfig, TraceRequest, replay
from hkv_core.replay.tiers import TierRates, TierReplay

BLOCK = 4


def request(i: int, *blocks: int) -> TraceRequest:
    """Whole blocks `blocks`, then one token of a partial block (so every whole block can be a hit)."""
    return TraceRequest(timestamp=i, input_length=BLOCK * len(blocks) + 1, output_length=1,
                        hash_ids=(*blocks, 900 + i))


def tiers(host_blocks: int, disk_blocks: int, rates: TierRates | None = None) -> TierReplay:
    return TierReplay(Layout.from_preset("llama_full", block_tokens=BLOCK), host_blocks, disk_blocks, rates)


def test_blocks_move_host_to_disk_to_nowhere_least_recent_first() -> None:
    t = tiers(host_blocks=2, disk_blocks=1)
    t.store((1, 2, 3), 3)  # written deepest first: 3, 2, 1 (1, the head, most recent); 3 spills to disk
    assert (t.where(1), t.where(2), t.where(3)) == ("host", "host", "disk")
    t.store((4,), 1)  # 2 spills to disk, 3 is dropped
    assert (t.where(1), t.where(2), t.where(3), t.where(4)) == ("host", "disk", None, "host")
    assert t.totals.moved_to_disk == 2 and t.totals.dropped == 1


def test_after_the_device_hit_the_tiers_serve_what_they_hold_and_what_pays() -> None:
    fast = tiers(4, 4)
    fast.store((1, 2, 3), 3)
    assert fast.serve((1, 2, 3, 9), device_blocks=1, prompt_tokens=4 * BLOCK + 1) == 2 * BLOCK  # blocks 2, 3
    assert fast.totals.decisions == {"load": 1} and fast.totals.tokens == {"host": 2 * BLOCK}
    assert fast.serve((5,), device_blocks=0, prompt_tokens=BLOCK + 1) == 0 and fast.totals.decisions["none"] == 1
    slow = tiers(4, 4, TierRates(compute_flops_per_s=1e30))  # compute is free: loading never pays
    slow.store((1, 2), 2)
    assert slow.serve((1, 2), device_blocks=0, prompt_tokens=2 * BLOCK + 1) == 0
    assert slow.totals.decisions == {"recompute": 1}


def test_a_replay_reports_what_the_tiers_served() -> None:
    trace = [request(0, 1, 2, 3), request(1, 4, 5, 6), request(2, 1, 2, 3)]
    device_only = replay(trace, ReplayConfig(block_tokens=BLOCK, capacity_tokens=4 * BLOCK))
    assert device_only.hits == (0, 0, 0) and device_only.tiers is None  # the device forgot 1, 2, 3
    tiered = replay(trace, ReplayConfig(block_tokens=BLOCK, capacity_tokens=4 * BLOCK, host_tokens=6 * BLOCK))
    assert tiered.hits == (0, 0, 0) and tiered.tiers is not None
    assert tiered.tiers.tokens == {"host": 3 * BLOCK} and tiered.tiers.decisions["load"] == 1
    assert tiered.tokens_recomputed == device_only.tokens_recomputed - 3 * BLOCK
    assert tiered.to_dict()["tiers"]["tokens_loaded"] == {"host": 3 * BLOCK}


def test_negative_tier_sizes_are_refused() -> None:
    with pytest.raises(ConfigError, match="host_tokens"):
        ReplayConfig(host_tokens=-1)
