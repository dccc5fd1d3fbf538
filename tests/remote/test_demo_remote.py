"""`hkv demo --remote` as a user runs it: two instances in two processes share one local master, every response
exact; the combinations it does not run are refused with exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import needs_mooncake


def demo(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hkv_cli.main", "demo", "--out", str(tmp_path), *args],
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "160"}, timeout=300)


@needs_mooncake
def test_demo_remote_shares_prefixes_between_two_processes_exactly(tmp_path: Path) -> None:
    done = demo(tmp_path, "--remote", "--requests", "24", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["exact_matches"] == report["requests"] == 24
    a, b = report["per_instance"]["A"], report["per_instance"]["B"]
    assert a["requests"] == b["requests"] == 12 and a["exact"] == b["exact"] == 12
    assert a["from_remote"] + b["from_remote"] > 0  # each served prefixes the other computed
    assert all(report["remote_counts"][n]["published"] > 0 for n in "AB")
    assert (tmp_path / "mooncake_master.log").exists() and (tmp_path / "instance_B.log").exists()
    table = demo(tmp_path, "--remote", "--requests", "4")
    assert table.returncode == 0 and "served from remote" in table.stdout and "2/2" in table.stdout, table.stderr


@pytest.mark.parametrize("other", [["--tiers"], ["--draft-k", "2"], ["--fault", "drop_tail"],
                                   ["--executor", "stand-in"], ["--model", "hf-deepseek-v4"]])
def test_demo_remote_refuses_what_it_does_not_combine_with(tmp_path: Path, other: list[str]) -> None:
    done = demo(tmp_path, "--remote", "--requests", "2", "--json", *other)
    assert done.returncode == 2 and "--remote runs without" in json.loads(done.stdout)["error"]["message"]
