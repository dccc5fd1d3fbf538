"""The load-or-recompute decision with known rates, and the TierCache's order, budgets and checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hkv_core import Layout
from hkv_core.errors import ConfigError, InvalidArgument
from hkv_core.tiers.cost import Candidate, CostModel, Rate, recompute_flops
from hkv_core.tiers.record import RecordHeader, checksum
from hkv_tiers import DiskStore, TierCache
from hkv_tiers.record_check import Wanted, record_name
from hkv_tiers.span_io import BLOCK as BLOCK_KIND
from hkv_tiers.span_io import POINT
from hkv_tiers.tier_cache import RECORDS_DIR

LAYOUT = Layout.from_preset("tiny_v4")
BLOCK = LAYOUT.block_tokens


def model(flops_per_s: float, host: tuple[float, float], disk: tuple[float, float], policy: str = "cost") -> CostModel:
    return CostModel(compute=Rate(flops_per_s), tiers={"host": Rate(*host), "disk": Rate(*disk)}, policy=policy)


def blocks(*tiers: str, start: int = 0, nbytes: int = 4096) -> list[Candidate]:
    """One candidate per block, its records (a block and a point record) in tier `t`."""
    return [Candidate(lo=start + i * BLOCK, hi=start + (i + 1) * BLOCK, tokens={t: BLOCK}, bytes={t: nbytes},
                      records={t: 2}) for i, t in enumerate(tiers)]


def test_recompute_flops_grow_with_tokens_and_with_position() -> None:
    assert recompute_flops(LAYOUT, 0, 0) == 0
    assert recompute_flops(LAYOUT, 0, 16) > recompute_flops(LAYOUT, 0, 8) > 0
    assert recompute_flops(LAYOUT, 800, 808) > recompute_flops(LAYOUT, 0, 8)  # attention over more entries
    full = Layout.from_preset("llama_full")  # full attention: every earlier token, however far back
    assert recompute_flops(full, 100_000, 100_008) > 1.5 * recompute_flops(full, 0, 8)
    swa = Layout.from_preset("mistral_swa")  # a sliding window only: past the window, a token costs the same
    assert recompute_flops(swa, 100_000, 100_008) == recompute_flops(swa, 50_000, 50_008)
    hybrid = Layout.from_preset("qwen3_next_80b")  # 36 linear layers: their cost does not grow with position
    only_full = recompute_flops(hybrid, 100_000, 100_008) - recompute_flops(hybrid, 0, 8)
    twelve = sum(len(g.layer_ids) for g in hybrid.groups if g.state is None)
    assert twelve == 12
    assert only_full == pytest.approx(12 * 4.0 * 16 * 256 * 100_000 * 8, rel=1e-9)  # full layers' growth only


def test_the_decision_loads_what_is_cheaper_to_load_than_to_compute() -> None:
    cheap = model(1e6, host=(1e12, 0.0), disk=(1e12, 0.0))
    decision = cheap.decide(LAYOUT, 16, blocks("host", "disk", start=16))
    assert decision.action == "load" and decision.load_tokens == {"host": 8, "disk": 8}
    assert decision.load_s < decision.recompute_s and decision.device_tokens == 16
    free_compute = model(1e18, host=(1e9, 1e-6), disk=(1e9, 1e-3))
    assert free_compute.decide(LAYOUT, 0, blocks("host")).action == "recompute"
    assert free_compute.decide(LAYOUT, 0, []).action == "none"


def test_a_slow_disk_after_a_fast_host_splits_the_prefix() -> None:
    flops = recompute_flops(LAYOUT, 0, BLOCK)
    split = model(flops / 1e-3, host=(1e12, 1e-6), disk=(1e12, 1.0))  # a block: 1 ms to compute, 1 s from disk
    decision = split.decide(LAYOUT, 0, blocks("host", "host", "disk", "disk"))
    assert decision.action == "split" and decision.load_tokens == {"host": 16, "disk": 0} and decision.chosen == 2
    assert decision.candidate_tokens == 32 and decision.loaded_tokens == 16


def test_forced_policies_and_a_bad_policy() -> None:
    assert model(1e18, (1, 1), (1, 1), policy="load").decide(LAYOUT, 0, blocks("disk")).action == "load"
    assert model(1e-3, (1e12, 0), (1e12, 0), policy="recompute").decide(LAYOUT, 0, blocks("host")).action == \
        "recompute"
    with pytest.raises(InvalidArgument, match="policy"):
        model(1, (1, 1), (1, 1), policy="maybe")


def test_rates_follow_measurements_unless_fixed() -> None:
    rate = Rate(1.0)
    rate.observe(100.0, 1.0)
    assert rate.value == 100.0 and rate.measured == 1  # the first measurement replaces the default
    rate.observe(200.0, 1.0)
    assert rate.value == pytest.approx(120.0)  # then a moving average
    fixed = Rate(5.0, fixed=True)
    fixed.observe(100.0, 1.0)
    assert fixed.value == 5.0


def cache(tmp_path: Path, host_bytes: int, disk_bytes: int = 1 << 20) -> TierCache:
    return TierCache(pools=LAYOUT.pools, layout_fingerprint=LAYOUT.fingerprint(), model_id="m", key_seed=1,
                     host_bytes=host_bytes, directory=tmp_path, disk_bytes=disk_bytes)


def key(i: int) -> np.ndarray:
    return np.array([i, i + 1000], np.uint64)


def test_lookups_touch_heads_last_so_tails_leave_the_host_first(tmp_path: Path) -> None:
    tiers = cache(tmp_path, host_bytes=4 * 8192)  # four records; past three, the least recent start moving
    for i in range(3):  # blocks 0, 1, 2 of one prefix
        tiers.put(BLOCK_KIND, key(i), i * BLOCK, (i + 1) * BLOCK, bytes(100))
    tiers.touch([record_name(key(i)) for i in range(3)])
    tiers.put(BLOCK_KIND, key(9), 0, BLOCK, bytes(100))  # the arena is full: its least recent record moves to disk
    tiers.drain()
    assert tiers.where(record_name(key(2))) == "disk"  # the deepest block of the prefix went first
    assert [tiers.where(record_name(key(i))) for i in (0, 1, 9)] == ["host"] * 3
    tiers.close()


def test_the_disk_budget_deletes_least_recent_records(tmp_path: Path) -> None:
    tiers = cache(tmp_path, host_bytes=0, disk_bytes=2 * 8192)  # no host: straight to disk, two records fit
    for i in range(3):
        tiers.put(BLOCK_KIND, key(i), 0, BLOCK, bytes(100))
    tiers.drain()
    assert [tiers.where(record_name(key(i))) for i in range(3)] == [None, "disk", "disk"]
    assert tiers.counts["evicted_disk"] == 1
    tiers.close()


def test_a_record_that_does_not_describe_the_block_asked_for_is_never_served(tmp_path: Path) -> None:
    tiers = cache(tmp_path, host_bytes=1 << 16)
    payload = bytes(range(200))
    tiers.put(BLOCK_KIND, key(1), 8, 16, payload)
    assert tiers.fetch([Wanted(BLOCK_KIND, key(1), 8, 16)])[0] is not None
    assert tiers.fetch([Wanted(POINT, key(1), 8, 16)]) == [None]  # not held
    assert tiers.fetch([Wanted(BLOCK_KIND, key(1), 16, 24)]) == [None]  # another token range: quarantined
    assert tiers.where(record_name(key(1))) is None and tiers.counts["quarantined_host"] == 1
    tiers.close()


def test_records_of_another_layout_in_the_directory_are_quarantined_at_open(tmp_path: Path) -> None:
    cache(tmp_path, host_bytes=0).close()  # the directory's cache.json: this layout's cache
    other = Layout.from_preset("tiny_csa").fingerprint()
    store = DiskStore(tmp_path / RECORDS_DIR, 1 << 20, other)
    payload = bytes(64)
    store.put("x" * 32, RecordHeader(layout_fingerprint=other, kind=BLOCK_KIND, abi_id="a", token_start=0,
                                     token_end=8, keys=np.zeros((1, 2), np.uint64), payload_bytes=64,
                                     payload_checksum=checksum(payload)), payload)
    tiers = cache(tmp_path, host_bytes=0)
    assert tiers.disk is not None and tiers.disk.counts["quarantined"] == 1 and not tiers.disk_order
    tiers.close()


def test_records_without_the_cache_json_that_owns_them_are_refused(tmp_path: Path) -> None:
    tiers = cache(tmp_path, host_bytes=0)
    tiers.put(BLOCK_KIND, key(1), 0, 8, bytes(64))
    tiers.close()
    (tmp_path / "cache.json").unlink()  # whose records are these now?
    with pytest.raises(ConfigError, match="records without the cache.json"):
        cache(tmp_path, host_bytes=0)
