"""Cluster replay: N instances behind a router, with or without a shared remote tier (hkv_core.replay.cluster).

Hand-made traces where the right routing and the remote tier's hits are known exactly; one instance
reproduces `replay`; a router that does not listen to the KV events is caught; the CLI prints the sweep and
draws its chart; the Mooncake figures of the README (skipped without ../shared/traces).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hkv_core.errors import ConfigError
from hkv_core.events import EventsLost
from hkv_core.replay import ReplayConfig, TraceRequest, read_trace, replay
from hkv_core.replay import cluster as cluster_module
from hkv_core.replay.cluster import ClusterConfig, PrefixRouter, cluster_replay
from hkv_core.replay.run import manager_for
from hkv_core.replay.synthetic import write_trace

MOONCAKE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
BT = 4  # tokens per block
PER_INSTANCE = ReplayConfig(block_tokens=BT, capacity_tokens=8 * BT)  # 8 blocks per instance


def sessions(turns: int = 3, prefixes: int = 2, head_blocks: int = 3) -> list[TraceRequest]:
    """`prefixes` shared heads of `head_blocks` blocks, each followed by one fresh block and a partial one."""
    out, fresh = [], 10_000
    for _ in range(turns):
        for p in range(prefixes):
            head = tuple(100 * (p + 1) + b for b in range(head_blocks))
            out.append(TraceRequest(timestamp=len(out), input_length=(head_blocks + 1) * BT + 1, output_length=1,
                                    hash_ids=(*head, fresh, fresh + 1)))
            fresh += 2
    return out


def run(trace: list[TraceRequest], **options: object) -> cluster_module.ClusterResult:
    return cluster_replay(trace, ClusterConfig(instance=PER_INSTANCE, **options))  # type: ignore[arg-type]


def test_one_instance_is_replay() -> None:
    trace = sessions()
    single = replay(trace, PER_INSTANCE)
    for router in ("round-robin", "prefix-aware"):
        result = run(trace, instances=1, router=router)
        assert result.tokens_by_source["device"] == single.hit_tokens and result.hit_tokens == single.hit_tokens


def test_prefix_aware_routing_keeps_each_prefix_on_one_instance() -> None:
    trace = sessions(turns=3, prefixes=2)  # A B A B A B: round-robin happens to keep A and B in place too
    rr, aware = run(trace, instances=2, router="round-robin"), run(trace, instances=2, router="prefix-aware")
    # A B C A B C A B C: round-robin moves every prefix to the other instance at each turn
    trace3 = sessions(turns=3, prefixes=3)
    rr3, aware3 = run(trace3, instances=2, router="round-robin"), run(trace3, instances=2, router="prefix-aware")
    head = 3 * BT
    assert aware3.tokens_by_source["device"] == 2 * 3 * head  # turns 2 and 3 of every prefix hit its head
    assert rr3.tokens_by_source["device"] < aware3.tokens_by_source["device"]
    assert aware.hit_tokens == rr.hit_tokens == 2 * 2 * head
    assert sum(aware3.requests_per_instance) == len(trace3)


def test_a_router_that_ignores_the_events_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PrefixRouter, "hear", lambda self, instance, events: None)
    trace = sessions(turns=3, prefixes=3)
    deaf = run(trace, instances=2, router="prefix-aware")
    assert deaf.tokens_by_source["device"] < 2 * 3 * 3 * BT


def test_lost_events_make_an_instance_unknown() -> None:
    router = PrefixRouter(2, manager_for(sessions(), PER_INSTANCE, kv_events=True))
    router.held[0].add(b"x" * 16)
    router.hear(0, [EventsLost(count=3)])
    assert router.held[0] == set()


def test_the_remote_tier_serves_what_another_instance_computed() -> None:
    trace = sessions(turns=2, prefixes=3)  # round-robin over 2 moves every prefix to the other instance
    without = run(trace, instances=2, router="round-robin")
    shared = run(trace, instances=2, router="round-robin", remote_tokens=64 * BT)
    assert shared.tokens_by_source["remote"] > 0
    assert shared.hit_tokens == without.hit_tokens + shared.tokens_by_source["remote"]
    assert shared.hit_tokens == 3 * 3 * BT  # every second turn resumes after its head
    tiny = run(trace, instances=2, router="round-robin", remote_tokens=BT)  # one block: LRU keeps the last one
    assert tiny.tokens_by_source["remote"] < shared.tokens_by_source["remote"]


@pytest.mark.parametrize("options, key", [
    ({"router": "random"}, "router"), ({"instances": 0}, "instances"), ({"remote_tokens": -1}, "remote_tokens"),
    ({"instance": ReplayConfig(policy="belady")}, "policy"),
])
def test_bad_cluster_configs_are_config_errors(options: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        ClusterConfig(**options)  # type: ignore[arg-type]
    assert info.value.fields["key"] == key


def test_cli_sweep_prints_every_configuration_and_draws_the_chart(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    write_trace(sessions(turns=3, prefixes=3), path)
    args = [sys.executable, "-m", "hkv_cli.main", "replay", str(path), "--block-tokens", str(BT),
            "--capacity-tokens", str(8 * BT), "--instances", "2", "--router", "round-robin", "--router",
            "prefix-aware", "--remote-capacity-tokens", str(64 * BT), "--sweep", "--out", str(tmp_path), "--json"]
    done = subprocess.run(args, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert len(report["results"]) == 4 * 2 * 2  # instances 1 2 4 8, two routers, without and with remote
    assert {r["instances"] for r in report["results"]} == {1, 2, 4, 8}
    assert report["chart"] is None or Path(report["chart"]).stat().st_size > 0


def test_cli_without_a_remote_tier_and_with_an_unbounded_one(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    write_trace(sessions(turns=2, prefixes=3), path)
    base = [sys.executable, "-m", "hkv_cli.main", "replay", str(path), "--block-tokens", str(BT),
            "--capacity-tokens", str(8 * BT), "--instances", "2", "--router", "round-robin", "--json"]
    plain = subprocess.run(base, capture_output=True, text=True)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    (result,) = json.loads(plain.stdout)["results"]
    assert result["remote_tokens"] == 0 and result["tokens_by_source"]["remote"] == 0
    unbounded = subprocess.run([*base, "--remote-capacity-tokens", "inf"], capture_output=True, text=True)
    (shared,) = json.loads(unbounded.stdout)["results"]
    assert shared["tokens_by_source"]["remote"] > 0
    refused = subprocess.run([*base, "--remote-capacity-tokens", "-5"], capture_output=True, text=True)
    assert refused.returncode == 2
    alone = [a for a in base if a not in ("--instances", "2", "--router", "round-robin")]
    lonely = subprocess.run([*alone, "--remote-capacity-tokens", "64"], capture_output=True, text=True)
    assert lonely.returncode == 2 and "needs --instances" in json.loads(lonely.stdout)["error"]["message"]


@pytest.mark.skipif(not MOONCAKE.exists(), reason="the shared Mooncake trace is not beside this checkout")
def test_mooncake_cluster_figures() -> None:
    """The README's cluster table (3,000 blocks per instance): prefix-aware routing and the shared tier."""
    trace = read_trace(MOONCAKE, 512)
    base = ReplayConfig(block_tokens=512, capacity_tokens=3_000 * 512)
    rate = {(n, r, t): round(cluster_replay(trace, ClusterConfig(instance=base, instances=n, router=r,
                                                                 remote_tokens=t * 512)).token_hit_rate, 3)
            for n, r, t in [(8, "round-robin", 0), (8, "prefix-aware", 0), (8, "prefix-aware", 30_000)]}
    assert rate == {(8, "round-robin", 0): 0.151, (8, "prefix-aware", 0): 0.611, (8, "prefix-aware", 30_000): 0.639}
