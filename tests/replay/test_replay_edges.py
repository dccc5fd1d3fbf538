"""Replay edges: hybrid layouts (whose allocations carry copy plans), traces that are not prefix-chained,
a cloned adaptive manager, requests that do not fit, and malformed input - each replays or is refused with a
ConfigError naming what is wrong."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from hkv_core.errors import ConfigError
from hkv_core.manager.index.adaptive import AdaptivePolicy
from hkv_core.replay import ReplayConfig, TraceRequest, read_trace, replay
from hkv_core.replay.run import manager_for
from hkv_core.replay.trace import MAX_TRACE_LINE_BYTES, prompt_of


def request(i: int, block: int, *ids: int) -> TraceRequest:
    return TraceRequest(timestamp=i, input_length=block * len(ids) + 1, output_length=1, hash_ids=(*ids, 900 + i))


@pytest.mark.parametrize(("layout", "block"), [("tiny_v4", 8), ("tiny_csa", 8), ("deepseek_v4_flash", 256)])
@pytest.mark.parametrize("policy", ["lru", "belady", "adaptive"])
def test_hybrid_layouts_replay(layout: str, block: int, policy: str) -> None:
    trace = [request(0, block, 1, 2, 3), request(1, block, 1, 2, 4), request(2, block, 1, 2, 3)]
    result = replay(trace, ReplayConfig(layout=layout, block_tokens=block, policy=policy))
    # the second request shares two blocks but no resume point (kept at the first prompt's end, 3 blocks);
    # the third resumes there: a hybrid layout hits only where its window and tails were kept
    assert result.hits == (0, 0, 3 * block)


def test_a_trace_that_is_not_prefix_chained_is_refused(tmp_path: Path) -> None:
    bad = [request(0, 4, 1, 2), request(1, 4, 3, 2)]  # id 2 at block 1 after 1, then after 3
    with pytest.raises(ConfigError, match="line 2: hash id 2 at block 1 follows 3"):
        replay(bad, ReplayConfig(block_tokens=4, policy="belady"))
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 9, "output_length": 1, "hash_ids": [1, 2, 7]}\n'
                    '{"timestamp": 1, "input_length": 9, "output_length": 1, "hash_ids": [3, 2, 8]}\n')
    with pytest.raises(ConfigError, match="line 2"):
        read_trace(path, 4)


def test_a_cloned_adaptive_manager_reads_its_own_keys() -> None:
    trace = [request(0, 4, 1, 2), request(1, 4, 5, 6)]
    config = ReplayConfig(block_tokens=4, policy="adaptive")
    m = manager_for(trace, config)  # the policy built with the manager (ManagerConfig.eviction)
    twin = m.clone()
    policy = twin.core.index.policy
    assert isinstance(policy, AdaptivePolicy) and policy.keys is twin.core.index.blocks.key
    assert policy.keys is not m.core.index.blocks.key
    rid = twin.add_request(prompt_of(trace[1], 4))
    twin.acquire(rid, twin.match(rid))
    twin.commit(rid, twin.allocate(rid, 9).num_tokens)
    twin.release(rid)
    assert m.index_counts()["blocks"] == 0 and twin.index_counts()["blocks"] > 0  # the original unchanged


def test_a_request_that_does_not_fit_uses_no_tier() -> None:
    trace = [request(0, 4, 1, 2, 3, 4), request(1, 4, 1, 2, 3, 4)]  # 5 blocks each, a device of 2
    result = replay(trace, ReplayConfig(block_tokens=4, capacity_tokens=8, host_tokens=40))
    assert result.uncached_requests == 2 and result.tiers is not None and not result.tiers.tokens
    assert result.tokens_recomputed == result.prompt_tokens - result.hit_tokens


@pytest.mark.parametrize("line", ['{"timestamp": 0, "input_length": ' + "9" * 5000 + "}", "[" * 200_000])
def test_lines_json_cannot_hold_are_config_errors(tmp_path: Path, line: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError, match="line 1"):
        read_trace(path, 4)


def test_bad_block_sizes_and_empty_traces_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="block_tokens"):
        ReplayConfig(block_tokens=0)
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}\n')
    with pytest.raises(ConfigError, match="block_tokens"):
        read_trace(tmp_path / "t.jsonl", 0)
    with pytest.raises(ConfigError, match="no requests"):
        replay([], ReplayConfig())
    with pytest.raises(ConfigError, match="hash ids"):
        replay([request(0, 4, 1, 2)], ReplayConfig(block_tokens=8))
    assert np.array_equal(prompt_of(request(0, 4, 7), 4)[:1], [7])


def test_a_trace_must_be_a_regular_file_and_each_line_is_bounded(tmp_path: Path) -> None:
    """issue 27 (1, 2): a device or a FIFO is refused before a byte is read (a FIFO is not waited on); a line
    past MAX_TRACE_LINE_BYTES is refused without reading the rest of it."""
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    for path in ("/dev/zero", fifo, tmp_path):
        with pytest.raises(ConfigError, match="not a regular file") as err:
            read_trace(path, 4)
        assert err.value.fields["key"] == "file"
    long = tmp_path / "long.jsonl"
    long.write_text("x" * (MAX_TRACE_LINE_BYTES + 10) + "\n")
    with pytest.raises(ConfigError, match=f"line 1: longer than {MAX_TRACE_LINE_BYTES:,} bytes"):
        read_trace(long, 4)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}\n\xff\n')
    with pytest.raises(ConfigError, match="line 2: not UTF-8"):
        read_trace(latin, 4)
    with pytest.raises(ConfigError, match="cannot read the trace: No such file"):
        read_trace(tmp_path / "missing.jsonl", 4)
