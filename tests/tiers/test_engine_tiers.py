"""The oracle through host and disk tiers: constant offload and reload, restarts, crashes, bad set-ups.

The device and host tiers are a few requests small, so blocks keep moving
device -> host -> disk and come back from each; every response must still be
bit-identical to a recomputation, and a reopened engine must serve from disk.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
from tier_workload import Sessions, pages_leaked, tiny

from hkv_core.errors import ConfigError, InvalidArgument, TierError
from hkv_core.manager import CacheManager
from hkv_exec_ref.engine import DraftSpec, Engine
from hkv_tiers import Crash, DiskFaults


def test_small_device_and_host_move_blocks_through_disk_and_back(tmp_path: Path) -> None:
    engine = tiny(tmp_path)
    sessions = Sessions()
    for _ in range(4):
        sessions.round(engine)
    counts = engine.tiers.cache.report()["counts"] if engine.tiers else {}
    assert counts["demoted"] > 0 and counts["loaded_disk"] > 0 and counts["loaded_host"] > 0, counts
    assert engine.stats.cached_by_tier["disk"] > 0 and engine.stats.cached_by_tier["host"] > 0
    assert engine.stats.cached_by_tier["device"] > 0
    assert sum(engine.stats.cached_by_tier.values()) == engine.stats.cached_tokens
    assert pages_leaked(engine) == {}
    engine.close()


def test_every_result_says_where_its_prefix_came_from(tmp_path: Path) -> None:
    engine = tiny(tmp_path)
    prompt = np.arange(40) % 64
    first = engine.generate(prompt, 3)
    assert first.cached_by_tier == {"device": 0, "host": 0, "disk": 0, "remote": 0}
    assert first.tier_decision is not None and first.tier_decision.action == "none"
    engine.evict("device")
    again = engine.generate(prompt, 3)
    # 5 blocks kept, the last one computed
    assert again.cached_by_tier == {"device": 0, "host": 32, "disk": 0, "remote": 0}
    assert again.tier_decision is not None and again.tier_decision.action == "load"
    assert again.tier_decision.load_tokens == {"host": 32, "disk": 0}
    assert again.same_outputs(first) and engine.matches_recompute(prompt, again)
    engine.evict("device")
    assert engine.evict("host") == 8  # 5 block records; point records at the kept points 16, 32 and 40
    from_disk = engine.generate(prompt, 3)
    assert from_disk.cached_by_tier == {"device": 0, "host": 0, "disk": 32, "remote": 0}
    assert from_disk.same_outputs(first)
    engine.close()


def test_a_reopened_engine_serves_from_disk_bit_exact(tmp_path: Path) -> None:
    engine = tiny(tmp_path)
    sessions = Sessions()
    for _ in range(2):
        first = sessions.round(engine)
    engine.close()  # flushes the host tier to disk
    reopened = tiny(tmp_path)
    assert reopened.tiers is not None and reopened.tiers.cache.counts["restored"] > 0
    for i, (prompt, before) in enumerate(first):
        after = reopened.generate(prompt, 4)
        assert after.cached_by_tier["disk"] > 0  # the first request's device is empty; later ones share its head
        assert after.cached_by_tier["device"] == 0 or i > 0
        assert after.same_outputs(before) and reopened.matches_recompute(prompt, after)
    reopened.close()


def test_a_crash_between_write_and_rename_loses_only_unpublished_records(tmp_path: Path) -> None:
    faults = DiskFaults()
    engine = tiny(tmp_path, disk_faults=faults)
    sessions = Sessions()
    sessions.round(engine)
    faults.crash_before_rename = 1
    with pytest.raises(Crash):
        for _ in range(3):
            sessions.round(engine)
    assert engine.tiers is not None
    engine.tiers.cache.abandon()  # the process died: nothing flushed, the lock released
    reopened = tiny(tmp_path)
    assert reopened.tiers is not None and reopened.tiers.cache.disk is not None
    assert reopened.tiers.cache.disk.counts["temp_removed"] > 0  # the batch that never got its rename
    for _ in range(2):
        sessions.round(reopened)  # exact (checked inside), from what survived
    assert reopened.stats.cached_by_tier["disk"] > 0
    reopened.close()


def test_one_cache_per_directory_and_it_belongs_to_one_model(tmp_path: Path) -> None:
    engine = tiny(tmp_path)
    with pytest.raises(TierError, match="in use"):
        tiny(tmp_path)
    engine.generate(np.arange(20) % 64, 2)
    engine.close()
    with pytest.raises(ConfigError, match="model_id"):
        Engine.tiny(1, disk_dir=tmp_path)  # another model's weights: its records would be wrong bytes
    with pytest.raises(ConfigError, match="key_seed"):
        Engine.tiny(0, disk_dir=tmp_path, key_seed=5)
    Engine.tiny(0, disk_dir=tmp_path).close()  # still usable: nothing was changed by the refusals


@pytest.mark.parametrize(("option", "value"), [("host_bytes", -1), ("disk_bytes", 1.5), ("loads_in_flight", 0),
                                               ("load_policy", "sometimes")])
def test_bad_tier_options_are_refused(tmp_path: Path, option: str, value: object) -> None:
    with pytest.raises(InvalidArgument, match=option.replace("load_", "")):
        Engine.tiny(0, disk_dir=tmp_path, **{option: value})
    assert not (tmp_path / "lock").exists() or Engine.tiny(0, disk_dir=tmp_path).close() is None  # not held


def test_evicting_a_tier_the_engine_lacks_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="only device"):
        Engine.tiny(0).evict("disk")


def test_the_cost_model_can_choose_to_recompute(tmp_path: Path) -> None:
    engine = tiny(tmp_path, load_policy="cost", compute_flops_per_s=1e18)  # compute is free: never load
    prompt = np.arange(40) % 64
    engine.generate(prompt, 2)
    engine.evict("device")
    again = engine.generate(prompt, 2)
    assert again.tier_decision is not None and again.tier_decision.action == "recompute"
    assert again.cached_tokens == 0 and again.tier_decision.recompute_s == 0.0
    assert again.tier_decision.candidate_tokens == 32 and engine.matches_recompute(prompt, again)
    engine.close()


def test_unusable_directories_and_arenas_are_typed_errors(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("x")
    for not_a_folder in (tmp_path / "a_file", Path(os.devnull)):  # issue 27: /dev/null said "File exists"
        with pytest.raises(TierError, match="cannot open the directory: Not a directory") as err:
            Engine.tiny(0, disk_dir=not_a_folder)
        assert err.value.fields["errno"] == errno.ENOTDIR
    with pytest.raises(TierError, match="cannot preallocate"):
        Engine.tiny(0, host_bytes=1 << 62)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "cache.json").write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable"):
        Engine.tiny(0, disk_dir=tmp_path / "broken")


def test_a_closed_engine_serves_no_more(tmp_path: Path) -> None:
    engine = tiny(tmp_path)
    engine.close()
    engine.close()  # twice is fine
    with pytest.raises(InvalidArgument, match="closed"):
        engine.generate([1, 2, 3], 2)
    tiny(tmp_path).close()  # the directory was released


def test_speculative_steps_over_tiers_stay_exact(tmp_path: Path) -> None:
    engine = tiny(tmp_path)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 64, 30) for _ in range(3)]
    for round_ in range(2):
        for prompt in prompts:
            served = engine.generate(prompt, 12, draft=DraftSpec(k=3, accept_probability=0.7, seed=round_))
            assert engine.matches_recompute(prompt, served) and served.accepted_tokens > 0
        engine.evict("device")
    assert engine.stats.cached_by_tier["host"] + engine.stats.cached_by_tier["disk"] > 0
    engine.close()


@pytest.mark.parametrize("skip", [True, False])
def test_a_load_runs_past_the_junction_where_the_device_chain_was_cut(tmp_path: Path, skip: bool,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The device keeps the prompt's blocks to 40 but points only to 32 (eviction took the tail); the host holds
    every block and the points at 48 and 56.  The junction (40, where the device chain ends) is skipped when a
    tier holds what follows, so the load goes on to 56; a link that kept it would stop there and load nothing."""
    if not skip:
        monkeypatch.setattr(CacheManager, "skip_junction", lambda self, rid: None)
    engine = tiny(tmp_path)
    prompt = np.arange(60) % 64  # blocks of 8, a point every 16 tokens and at 56
    first = engine.generate(prompt, 2)
    assert engine.manager.evict(4) == 4  # the points at 56 and 48 and the blocks ending at 56 and 48
    again = engine.generate(prompt, 2)
    assert again.cached_by_tier == {"device": 32, "host": 24 if skip else 0, "disk": 0, "remote": 0}
    assert again.same_outputs(first) and engine.matches_recompute(prompt, again)
    engine.close()
