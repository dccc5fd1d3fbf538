"""The README's speed figures are exactly what scripts/readme_figures.py renders from benchmarks/results/."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "scripts" / "readme_figures.py")
assert spec is not None and spec.loader is not None
figures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(figures)


def test_the_readme_block_is_the_rendered_one() -> None:
    text = (ROOT / "README.md").read_text()
    assert figures.refreshed(text) == text, "run: python scripts/readme_figures.py write"


def test_an_edited_figure_is_caught() -> None:
    text = (ROOT / "README.md").read_text()
    start = text.index(figures.BEGIN)
    edited = text[:start] + text[start:].replace("|", "| 1", 1)
    assert figures.refreshed(edited) != edited


def test_every_stored_result_names_its_commit() -> None:
    stored = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    assert stored, "no benchmark results stored"
    shallow = _git("rev-parse", "--is-shallow-repository").stdout.strip() != "false"  # a shallow clone lacks history
    for path in stored:
        run = json.loads(path.read_text())
        named = run.get("commit") or run.get("config", {}).get("code", "")
        assert len(named) >= 7 and "dirty" not in named and "unknown" not in named, path.name
        if not shallow:
            assert _git("cat-file", "-e", f"{named}^{{commit}}").returncode == 0, f"{path.name}: no commit {named}"


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def test_an_edited_hybrid_hit_rate_is_caught() -> None:
    text = (ROOT / "README.md").read_text()
    start = text.index(figures.HYBRID_BEGIN)
    edited = text[:start] + text[start:].replace(" GiB |", " GB |", 1)
    assert edited != text and figures.refreshed(edited) != edited


def test_the_stored_hybrid_replay_covers_both_traces_with_hkv_at_least_vllm() -> None:
    """The issue's bar for the stored run: both traces, several budgets, every hkv hit rate >= vLLM's, at equal
    device bytes (within one block of vLLM's)."""
    run = json.loads((ROOT / "benchmarks" / "results" / "hybrid_replay.json").read_text())
    assert {row["trace"] for row in run["rows"]} == {"mooncake", "sessions"}
    for row in run["rows"]:
        hkv = row["hkv"]
        assert hkv["device_bytes"] <= row["memory_gib"] * (1 << 30) + 1
        for side in ("vllm", "vllm_hopper"):  # vLLM's two set-ups for the model
            vllm = row[side]
            assert hkv["token_hit_rate"] >= vllm["token_hit_rate"], (row["trace"], side)
            assert abs(hkv["device_bytes"] - vllm["device_bytes"]) < 64 << 20  # a block or point apart, no more
