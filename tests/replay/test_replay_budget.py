"""A replay's memory budget in bytes (hkv_core/replay/budget.py): the split between per-token pages and point
snapshots, checked against figures computed by hand, the device bytes it leads to, and bad budgets refused."""

from __future__ import annotations

import pytest

from hkv_core.errors import ConfigError
from hkv_core.layout import Layout
from hkv_core.manager import ManagerConfig, estimate_device_bytes
from hkv_core.replay import ReplayConfig, TraceRequest, replay
from hkv_core.replay.budget import demand_share, pages_for_budget, point_bytes, token_bytes
from hkv_core.replay.run import layout_of

GIB = 1 << 30


def qwen3_next() -> Layout:
    return layout_of(ReplayConfig(layout="qwen3_next_80b", block_tokens=512, state_dtype="bfloat16"))


def test_qwen3_next_point_and_token_bytes_by_hand() -> None:
    layout = qwen3_next()
    # 36 Gated DeltaNet layers: conv (8192, 3) bf16 = 49,152 B and state (32, 128, 128) bf16 = 1,048,576 B
    assert point_bytes(layout) == 36 * (8192 * 3 * 2 + 32 * 128 * 128 * 2) == 39_518_208
    # 12 attention layers: K and V of 2 heads of 256 in bf16
    assert token_bytes(layout) == 12 * 2 * 2 * 256 * 2 == 24_576


def test_a_32_gib_budget_split_a_quarter_to_the_state() -> None:
    layout = qwen3_next()
    pages = pages_for_budget(layout, 32 * GIB, 0.25)
    nulls = 12 * 512 * 2048 + 39_518_208  # one KV page of 512 tokens and one point, set aside first
    usable = 32 * GIB - nulls
    points = int(usable * 0.25) // 39_518_208
    kv_pages = int(usable * 0.75 / 24_576) // 512
    assert (points, kv_pages) == (217, 2044)
    assert pages == {"full.compressed_kv": kv_pages, "linear.recurrent_state.conv": points,
                     "linear.recurrent_state.ssm": points}
    device = estimate_device_bytes(layout, ManagerConfig(pool_pages=pages)).total
    assert 32 * GIB - 512 * 24_576 - 39_518_208 < device <= 32 * GIB  # within one page of each kind


def test_a_layout_without_snapshots_gives_every_byte_to_its_pages() -> None:
    layout = Layout.from_preset("llama_full", block_tokens=16)
    pages = pages_for_budget(layout, GIB, 0.5)  # the share has nothing to split
    (spec,) = layout.pools
    assert pages == {spec.name: (GIB - spec.page_bytes * spec.layer_count) // (spec.page_bytes * spec.layer_count)}
    assert demand_share(layout, [TraceRequest(timestamp=0, input_length=64, output_length=1,
                                              hash_ids=(1, 2, 3, 4))], 16) == 0.0


@pytest.mark.parametrize(("memory", "share", "short"), [
    (10 * GIB, 0.001, "linear.recurrent_state.conv"),  # a thousandth of 10 GiB holds no 39.5 MB point
    (40_000_000, 0.5, "full.compressed_kv"),  # less than the NULL pages and one point
])
def test_a_budget_that_holds_nothing_of_a_pool_is_refused_by_name(memory: int, share: float, short: str) -> None:
    with pytest.raises(ConfigError) as info:
        pages_for_budget(qwen3_next(), memory, share)
    assert info.value.key == "memory_bytes" and short in info.value.reason


def test_a_layout_with_window_pools_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        pages_for_budget(Layout.from_preset("gemma3_12b", block_tokens=512), 64 * GIB, 0.2)
    assert info.value.key == "memory_bytes" and "window" in info.value.reason


def test_demand_share_counts_distinct_blocks_and_points_by_hand() -> None:
    layout = Layout.from_preset("tiny_linear", block_tokens=4)
    trace = [TraceRequest(timestamp=0, input_length=12, output_length=1, hash_ids=(1, 2, 3)),
             TraceRequest(timestamp=1, input_length=15, output_length=1, hash_ids=(1, 2, 9, 10))]
    # blocks (0,1) (1,2) (2,3) (2,9); points every 2 blocks: (2,2), at the prompt ends: (3,3) (3,9), and the
    # second prompt's junction after two blocks: (2,2) again
    per_point, per_block = point_bytes(layout), 4 * token_bytes(layout)
    assert (per_point, per_block) == (3 * 576 + 3 * 128, 4 * 64)
    assert demand_share(layout, trace, 2) == 3 * per_point / (3 * per_point + 4 * per_block)


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"capacity_tokens": 4096, "memory_bytes": GIB}, "memory_bytes"),
    ({"memory_bytes": 0}, "memory_bytes"),
    ({"memory_bytes": True}, "memory_bytes"),
    ({"state_share": 0.5}, "state_share"),  # nothing to split
    ({"memory_bytes": GIB, "state_share": 1.0}, "state_share"),
    ({"memory_bytes": GIB, "state_share": 0.0}, "state_share"),
    ({"retain_every_blocks": 0}, "retain_every_blocks"),
])
def test_bad_budgets_are_refused(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        ReplayConfig(**kwargs)  # type: ignore[arg-type]
    assert info.value.key == key


def test_an_unknown_state_dtype_is_refused_by_the_layout() -> None:
    with pytest.raises(ConfigError) as info:
        layout_of(ReplayConfig(layout="qwen3_next_80b", state_dtype="int3"))
    assert info.value.key == "hkv.ssm_state_dtype"


def test_a_replay_at_a_budget_stays_within_it_and_reports_the_split() -> None:
    trace = [TraceRequest(timestamp=i, input_length=4 * 20 + 1, output_length=1,
                          hash_ids=tuple(range(100 * (i % 3), 100 * (i % 3) + 21))) for i in range(12)]
    budget = 40_000  # 1 KB per point and 64 B per token: a few points and about 40 blocks
    result = replay(trace, ReplayConfig(layout="tiny_linear", block_tokens=4, memory_bytes=budget))
    assert 0 < result.device_bytes <= budget and result.memory_bytes == budget
    assert 0.0 < result.state_share < 1.0
    assert result.hit_tokens > 0 and result.uncached_requests == 0
