"""Trace replay: hand-made traces where each policy's choice is known exactly, the trace reader's refusals,
and the shared Mooncake trace's reference figures (skipped when ../shared/traces is absent)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hkv_core.errors import ConfigError
from hkv_core.replay import ReplayConfig, TraceRequest, read_trace, replay

MOONCAKE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
ROOTS = "ABCADAB"  # one full block each (a root), then one token of a partial block


def handmade() -> list[TraceRequest]:
    return [TraceRequest(timestamp=i, input_length=5, output_length=1, hash_ids=(ord(root), 1000 + i))
            for i, root in enumerate(ROOTS)]


def run(policy: str) -> tuple[int, ...]:
    config = ReplayConfig(block_tokens=4, capacity_tokens=16, policy=policy)  # 4 pages of one block each
    return tuple(hit // 4 for hit in replay(handmade(), config).hits)


def test_lru_evicts_the_least_recently_used_block() -> None:
    # A B C fill 3 of 4 pages; A hits; D misses and needs 2 pages: LRU evicts B (C, then A, were used later);
    # A hits; B misses and evicts C.
    assert run("lru") == (0, 0, 0, 1, 0, 1, 0)


def test_belady_evicts_the_block_used_farthest_ahead() -> None:
    # At D, Belady evicts C (never used again) instead of B (used last): B hits at the end.
    assert run("belady") == (0, 0, 0, 1, 0, 1, 1)


def test_unbounded_cache_hits_every_repeat() -> None:
    result = replay(handmade(), ReplayConfig(block_tokens=4))
    assert tuple(h // 4 for h in result.hits) == (0, 0, 0, 1, 0, 1, 1) and result.evicted_blocks == 0
    assert result.block_hit_rate == 3 / 14 and result.token_hit_rate == 12 / 35


@pytest.mark.parametrize(("line", "field"), [
    ("not json", "line"), ("[1, 2]", "line"),
    ('{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [1, 2]}', "timestamp"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}', "input_length"),
    ('{"timestamp": 0, "input_length": 5, "output_length": -2, "hash_ids": [1, 2]}', "output_length"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}', "hash_ids"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, "x"]}', "hash_ids"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, true]}', "hash_ids"),
])
def test_a_malformed_line_is_named_and_nothing_is_replayed(tmp_path: Path, line: str, field: str) -> None:
    good = json.dumps({"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, 2]})
    path = tmp_path / "trace.jsonl"
    path.write_text(f"{good}\n{line}\n{good}\n")
    with pytest.raises(ConfigError, match="line 2") as info:
        read_trace(path, 4)
    assert info.value.key == field


def test_unknown_policy_and_tiny_capacity_are_refused() -> None:
    with pytest.raises(ConfigError, match="the choices: lru, belady"):
        ReplayConfig(policy="fifo")
    with pytest.raises(ConfigError, match="at least one block"):
        ReplayConfig(capacity_tokens=100)


@pytest.mark.skipif(not MOONCAKE.exists(), reason=f"the shared Mooncake trace is not at {MOONCAKE}")
def test_mooncake_reference_figures() -> None:
    """Unbounded: the trace's own prefix hit rate (0.640 of blocks); LRU / Belady at 10k blocks of 512 tokens
    near the block-level simulation's 0.424 / 0.616 (docs/replay.md explains the small differences); adaptive
    closes at least 20 % of the gap there."""
    requests = read_trace(MOONCAKE, 512)
    assert len(requests) == 3993
    assert replay(requests, ReplayConfig()).block_hit_rate == pytest.approx(0.640, abs=0.005)
    lru = replay(requests, ReplayConfig(capacity_tokens=10_000 * 512))
    belady = replay(requests, ReplayConfig(capacity_tokens=10_000 * 512, policy="belady"))
    assert lru.block_hit_rate == pytest.approx(0.424, abs=0.015)
    assert belady.block_hit_rate == pytest.approx(0.616, abs=0.01)
    adaptive = replay(requests, ReplayConfig(capacity_tokens=10_000 * 512, policy="adaptive"))  # the target
    assert adaptive.block_hit_rate >= lru.block_hit_rate + 0.2 * (belady.block_hit_rate - lru.block_hit_rate)


def test_docs_say_where_the_mooncake_trace_comes_from() -> None:
    """docs/replay.md names the Mooncake release the shared trace is, its checksum and where the tests read it;
    the trace beside this checkout, when there, is that file."""
    import hashlib

    docs = (Path(__file__).resolve().parents[2] / "docs" / "replay.md").read_text()
    sha = "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131"
    for needed in ("kvcache-ai/Mooncake", "FAST25-release/traces/synthetic_trace.jsonl", "FAST'25", sha,
                   MOONCAKE.name, "a `shared/traces` folder beside"):
        assert needed in docs, needed
    if MOONCAKE.exists():
        assert hashlib.sha256(MOONCAKE.read_bytes()).hexdigest() == sha
