"""Two instances in two processes share prefixes through one Mooncake master, bit-exact, tenant by tenant."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from remote_helpers import KEY_SEED, engine, longer, prompt, published, store, threads

from hkv_exec_ref.demo.remote_demo import InstanceProcess
from hkv_tiers.mooncake_master import MooncakeMaster

ENGINE = {"seed": 0, "key_seed": KEY_SEED, "load_policy": "load"}


def ask(instance: InstanceProcess, tokens: np.ndarray, salt: str | None = None) -> dict:
    return instance.ask({"prompt": tokens.tolist(), "max_new_tokens": 4, "salt": salt})


def test_b_serves_bit_exact_the_prefix_a_computed_in_another_process(master: MooncakeMaster, tmp_path: Path) -> None:
    a = InstanceProcess(master.config(), ENGINE, tmp_path / "a.log")
    b = InstanceProcess(master.config(), ENGINE, tmp_path / "b.log")
    try:
        head = prompt(101)
        first = ask(a, head, salt="alice")
        assert first["exact"] and first["cached_by_tier"]["remote"] == 0  # nothing was in the store yet
        assert a.ask({"report": True})["report"]["remote"]["counts"]["published"] > 0
        same = ask(b, head, salt="alice")  # the same request on the other instance
        assert same["cached_by_tier"]["remote"] == 192  # every block but the one holding the last prompt token
        assert same["exact"] and same["logits_digest"] == first["logits_digest"] and same["tokens"] == first["tokens"]
        more = ask(b, longer(head, 102), salt="alice")
        assert more["exact"] and more["cached_by_tier"]["device"] == 200  # all of it on B's own device now
        report = b.ask({"report": True})
        assert report["report"]["remote"]["counts"]["loaded"] > 0 and report["cost"]["remote"][2] > 0  # measured
    finally:
        assert a.close() == 0 and b.close() == 0


def test_a_tenant_never_sees_another_tenants_prefix(master: MooncakeMaster, tmp_path: Path) -> None:
    a = InstanceProcess(master.config(), ENGINE, tmp_path / "a.log")
    b = InstanceProcess(master.config(), ENGINE, tmp_path / "b.log")
    try:
        head = prompt(111)
        assert ask(a, head, salt="alice")["exact"]
        bob = ask(b, head, salt="bob")
        assert bob["exact"] and sum(bob["cached_by_tier"].values()) == 0  # same tokens, another salt: no hit
        unsalted = ask(b, head)
        assert unsalted["exact"] and sum(unsalted["cached_by_tier"].values()) == 0
        alice = ask(b, head, salt="alice")
        assert alice["exact"] and alice["cached_by_tier"]["remote"] == 192
    finally:
        assert a.close() == 0 and b.close() == 0


def test_in_one_process_too_and_the_cost_model_learns_the_remote_rate(master: MooncakeMaster) -> None:
    before = threads()
    a, b = engine(master), engine(master)
    head = prompt(121)
    served = a.generate(head, 4)
    assert published(a) > 0
    rate = b.tiers.cost.tiers["remote"]  # type: ignore[union-attr]
    default = rate.value
    got = b.generate(longer(head, 122), 4)
    assert got.cached_by_tier["remote"] == 200 and b.matches_recompute(longer(head, 122), got)  # A's 200 tokens
    assert got.tier_decision is not None and got.tier_decision.load_tokens["remote"] == 200
    assert rate.measured == store(b).counts["loaded"] > 0 and rate.value != default
    assert b.stats.cached_by_tier["remote"] == 200 and served.cached_by_tier["remote"] == 0
    assert store(b).staging.used_bytes > 0  # the last fetch's payloads stay until the next fetch
    a.close()
    b.close()
    assert threads() <= before  # every worker stopped


def test_a_remote_load_is_kept_in_the_host_tier(master: MooncakeMaster) -> None:
    a, b = engine(master), engine(master, host_bytes=1 << 20)
    head = prompt(131)
    a.generate(head, 2)
    published(a)
    assert b.generate(longer(head, 132), 2).cached_by_tier["remote"] == 200
    b.evict("device")
    again = b.generate(longer(head, 133), 2)
    assert again.cached_by_tier["host"] == 200 and again.cached_by_tier["remote"] == 0
    assert b.matches_recompute(longer(head, 133), again)
    a.close()
    b.close()


def test_a_staging_arena_smaller_than_the_hit_still_loads_the_prefix_that_fits(master: MooncakeMaster) -> None:
    a, b = engine(master), engine(master, remote={"staging_bytes": 64 << 10})  # 8 slots: not the 38 records
    head = prompt(141)
    a.generate(head, 2)
    published(a)
    tokens = longer(head, 142)
    got = b.generate(tokens, 2)
    counts = store(b).counts
    assert counts["fetch_no_room"] > 0  # the hit is larger than the arena
    assert got.cached_by_tier["remote"] == 32 and b.matches_recompute(tokens, got)  # blocks 1-4 and their points
    a.close()
    b.close()


def test_instances_computing_with_another_array_library_never_share(master: MooncakeMaster) -> None:
    from hkv_exec_cuda import CudaExecutor
    from hkv_exec_cuda.strict import strict_backend

    numpy_one, other = engine(master), engine(master, executor=CudaExecutor(strict_backend()))
    assert store(numpy_one).prefix != store(other).prefix  # other bits (CuPy's exp is not NumPy's): other keys
    assert store(numpy_one).prefix == store(engine_again := engine(master)).prefix
    for e in (numpy_one, other, engine_again):
        e.close()
