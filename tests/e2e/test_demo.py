"""`hkv demo` as a user runs it: every response equals recomputation, every object kind is
served from the cache, and a fault switch makes it fail; the workload is a valid Mooncake trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hkv_cli.demo_cmd import _print, cut
from hkv_core.errors import InvalidArgument
from hkv_exec_ref.demo import WorkloadConfig, generate_trace, prompt_tokens, run_demo
from hkv_exec_ref.demo.workload import MAX_REQUESTS, MAX_SEED, read_trace, write_trace


def demo(tmp_path: Path, *args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hkv_cli.main", "demo", "--out", str(tmp_path), *args],
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": str(columns)})


def test_demo_json_every_response_matches(tmp_path: Path) -> None:
    done = demo(tmp_path, "--requests", "8", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["requests"] == report["exact_matches"] == 8 and report["mismatches"] == [] and report["ok"]
    assert set(report["cached_by_kind"]) == {"compressed_kv", "compressor_tail", "swa_window", "indexer_state"}
    assert all(n > 0 for n in report["cached_by_kind"].values()), report["cached_by_kind"]
    assert report["cached_tokens"] > 0 and report["pages_moved"] > 0
    assert "LCM_BOUNDARY" in report["validation"]["whole_block"]
    assert len(report["rows"]) == 8 and Path(report["trace"]).exists()
    assert report["chart"] is None or Path(report["chart"]).stat().st_size > 0


def test_demo_exits_1_when_a_fault_switch_is_on(tmp_path: Path) -> None:
    done = demo(tmp_path, "--requests", "8", "--json", "--fault", "drop_window_row")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["fault"] == "DROP_WINDOW_ROW" and report["mismatches"] and not report["ok"]


def test_demo_through_the_cuda_executor_stand_in_matches(tmp_path: Path) -> None:
    done = demo(tmp_path, "--requests", "8", "--json", "--executor", "stand-in")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["executor"] == "stand-in" and report["exact_matches"] == 8 and report["cached_tokens"] > 0
    reference = json.loads(demo(tmp_path, "--requests", "8", "--json").stdout)
    assert reference["executor"] == "ref"
    assert [r["cached_tokens"] for r in report["rows"]] == [r["cached_tokens"] for r in reference["rows"]]


def test_demo_serves_the_tiny_linear_hybrid_exactly(tmp_path: Path) -> None:
    done = demo(tmp_path, "--requests", "24", "--json", "--model", "tiny-linear")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["model"] == "tiny-linear" and report["exact_matches"] == 24 and report["mismatches"] == []
    assert set(report["cached_by_kind"]) == {"compressed_kv", "recurrent_state"}
    assert report["cached_by_kind"]["recurrent_state"] == report["cached_tokens"] > 0
    assert report["entries_copied"] > 0  # the hits' recurrent states, copied on write
    refused = demo(tmp_path, "--requests", "2", "--json", "--model", "tiny-linear", "--draft-k", "2")
    assert refused.returncode == 2 and "runs without" in json.loads(refused.stdout)["error"]["message"]


def test_demo_serves_hf_deepseek_v4_checked_against_hf(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="the hf extra (transformers, torch) is not installed")
    done = demo(tmp_path, "--requests", "8", "--json", "--model", "hf-deepseek-v4")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["model"] == "hf-deepseek-v4" and report["exact_matches"] == 8 and report["cached_tokens"] > 0
    assert all(n > 0 for n in report["cached_by_kind"].values()), report["cached_by_kind"]
    refused = demo(tmp_path, "--requests", "2", "--json", "--model", "hf-deepseek-v4", "--tiers")
    assert refused.returncode == 2 and "runs without" in json.loads(refused.stdout)["error"]["message"]


def test_demo_without_the_hf_extra_is_missing_dependency_exit_2(tmp_path: Path) -> None:
    """issue 27 (4): without torch / transformers `--model hf-deepseek-v4` was an internal error (exit 70)."""
    for hidden in ("torch", "transformers"):
        start = (f"import sys; sys.modules[{hidden!r}] = None; from hkv_cli.main import main; "  # as if not installed
                 f"main(['demo', '--out', {str(tmp_path)!r}, '--model', 'hf-deepseek-v4', '--json'])")
        done = subprocess.run([sys.executable, "-c", start], capture_output=True, text=True)
        assert done.returncode == 2, done.stdout + done.stderr
        error = json.loads(done.stdout)["error"]
        assert error["type"] == "MissingDependency" and error["fields"]["package"] == hidden, error
        assert "pip install 'hkv[hf]'" in error["message"] and not (tmp_path / "demo_trace.jsonl").exists()


def test_demo_on_a_gpu_without_one_is_a_typed_error_exit_2(tmp_path: Path) -> None:
    from hkv_core.errors import MissingDependency, NoDevice
    from hkv_exec_cuda import cupy_backend

    try:
        cupy_backend()
        pytest.skip("a GPU and CuPy are here: the cuda executor would run")
    except (MissingDependency, NoDevice):
        pass
    done = demo(tmp_path, "--requests", "2", "--json", "--executor", "cuda")
    assert done.returncode == 2
    error = json.loads(done.stdout)["error"]
    assert error["type"] in {"MissingDependency", "NoDevice"} and not (tmp_path / "demo_trace.jsonl").exists()


def test_demo_with_tiers_serves_from_every_tier_across_its_restart(tmp_path: Path) -> None:
    done = demo(tmp_path, "--tiers", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    tiers = report["tiers"]
    assert report["ok"] and tiers["restarts"] == 1 and tiers["counts"]["restored"] > 0
    assert all(tiers["cached_by_tier"][t] > 0 for t in ("device", "host", "disk")), tiers
    assert sum(tiers["cached_by_tier"].values()) == report["cached_tokens"]
    assert tiers["decisions"].get("load", 0) > 0 and (tmp_path / "tier-cache" / "cache.json").exists()
    table = demo(tmp_path, "--tiers", "--requests", "4")  # the directory is emptied first: a second run works
    assert table.returncode == 0 and "served from disk" in table.stdout, table.stderr


def test_demo_table_output(tmp_path: Path) -> None:
    done = demo(tmp_path, "--requests", "3")
    assert done.returncode == 0, done.stderr
    assert "exact match with recomputation" in done.stdout and "3/3" in done.stdout


def test_demo_table_says_what_each_number_means(tmp_path: Path) -> None:
    done = demo(tmp_path, "--requests", "12", columns=400)  # wide enough that no cell wraps
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    for meaning in ("cached + computed = served - requests", "(token positions)",
                    "only the window's last rows before the hit", "good: pages shared, no copy",
                    "shortened, rest recomputed", "meaning", "bit-identical",
                    "LCM_BOUNDARY: The hit ends on an LCM boundary"):
        assert meaning in text, meaning
    report = json.loads(demo(tmp_path, "--requests", "12", "--json").stdout)
    assert report["cached_tokens"] + report["computed_tokens"] == report["tokens_served"] - report["requests"]
    assert "token positions" not in report["units"]["validation"] and "prompt positions" in (
        report["units"]["cached_by_kind"])


def test_one_request_prints_no_empty_table(tmp_path: Path) -> None:
    done = demo(tmp_path, "--requests", "1")
    assert done.returncode == 0, done.stderr
    assert "no request found a cached prefix" in done.stdout
    assert "hit validation outcomes" not in done.stdout


def test_cut_lists_end_in_an_ellipsis() -> None:
    assert cut(list(range(3))) == "0, 1, 2"
    assert cut(list(range(25))) == "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ... (15 more)"


def test_printed_paths_and_notes_keep_their_brackets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_demo(WorkloadConfig(requests=2))
    _print(report, None, tmp_path / "a[bold]b" / "demo_trace.jsonl")
    text = "".join(capsys.readouterr().out.split())
    assert "a[bold]b/demo_trace.jsonl" in text and "'hkv[plot]'" in text


def test_workload_bounds_are_typed_errors() -> None:
    for name, value in (("requests", 0), ("requests", MAX_REQUESTS + 1), ("seed", -1), ("seed", MAX_SEED + 1)):
        with pytest.raises(InvalidArgument) as err:
            WorkloadConfig(**{name: value})
        assert err.value.fields["argument"] == name and err.value.fields["value"] == value
    assert WorkloadConfig(requests=MAX_REQUESTS, seed=MAX_SEED).requests == MAX_REQUESTS


def test_workload_is_a_prefix_chained_mooncake_trace(tmp_path: Path) -> None:
    cfg = WorkloadConfig(requests=40, seed=3)
    trace = generate_trace(cfg)
    assert len(trace) == 40 and trace == generate_trace(cfg)
    assert [r.timestamp for r in trace] == sorted(r.timestamp for r in trace)
    assert {r.kind for r in trace} == {"chat", "agent"}
    first_at: dict[int, tuple[int, ...]] = {}
    for r in trace:
        assert (len(r.hash_ids) - 1) * cfg.block_tokens < r.input_length <= len(r.hash_ids) * cfg.block_tokens
        for i, h in enumerate(r.hash_ids):
            assert first_at.setdefault(h, r.hash_ids[:i]) == r.hash_ids[:i], "hash ids are prefix-chained"
    sessions_by_first_block: dict[int, set[int]] = {}
    for r in trace:
        sessions_by_first_block.setdefault(r.hash_ids[0], set()).add(r.session)
    assert max(len(s) for s in sessions_by_first_block.values()) > 1, "sessions share system prompts"
    write_trace(trace, tmp_path / "t.jsonl")
    assert list(read_trace(tmp_path / "t.jsonl")) == trace
    line = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert {"timestamp", "input_length", "output_length", "hash_ids"} <= set(line)
    a, b = prompt_tokens(trace[0], cfg), prompt_tokens(trace[0], cfg)
    assert len(a) == trace[0].input_length and np.array_equal(a, b)
