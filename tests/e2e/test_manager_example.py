"""examples/manager_loop.py, the manager-only loop the README and docs/manager.md show: it runs as a user runs it,
the second request resumes from the first one's prefix on tiny_v4 and on V4-Flash, every state read back from the
pools equals a recomputation, what an engine could get wrong (snapshots not written, rows at the wrong slots, no
tail at P = 0) is caught by it, and the docs' snippet is the example's own code."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

from hkv_core.layout import EntryKind

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "manager_loop.py"


def load() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("manager_loop", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EX = load()


def test_the_example_runs_as_a_user_runs_it() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "tiny_v4 first: 123 prompt tokens, 0 from the cache (no reason codes), 8 resume states read back exact",
        "tiny_v4 second: 133 prompt tokens, 80 from the cache (LCM_BOUNDARY), 7 resume states read back exact"]


@pytest.mark.parametrize(("preset", "hit"), [("tiny_v4", 80), ("deepseek_v4_flash", 128)])
def test_the_second_request_resumes_and_every_state_read_is_exact(preset: str, hit: int) -> None:
    first, second = EX.main(preset)
    assert first["hit_tokens"] == 0 and second["hit_tokens"] == hit
    assert first["states_checked"] > 0 and second["states_checked"] > 0
    assert len(first["tokens"]) == len(second["tokens"]) == 6
    if preset == "deepseek_v4_flash":
        assert "PARTIAL_PAGE_COPY" in second["reasons"]  # the hit ends inside an HCA page: a copy plan ran


def no_snapshots(alloc: Any) -> Any:
    return attrs.evolve(alloc, snapshots={})


def window_rows_shifted(alloc: Any) -> Any:
    slots = {name: (np.roll(s, 1) if name.endswith("swa_window") and len(s) > 1 else s)
             for name, s in alloc.slots.items()}
    return attrs.evolve(alloc, slots=slots)


@pytest.mark.parametrize("broken", [no_snapshots, window_rows_shifted], ids=["no snapshots", "window rows shifted"])
def test_an_allocation_written_wrong_is_caught(monkeypatch: pytest.MonkeyPatch, broken: Any) -> None:
    write = EX.write_allocation
    monkeypatch.setattr(EX, "write_allocation", lambda ex, layout, alloc, rows, codes: write(
        ex, layout, broken(alloc), rows, codes))
    with pytest.raises(AssertionError, match="is not exact"):
        EX.main("tiny_v4")


def test_a_fresh_tail_left_unwritten_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    write_tail = EX.write_tail

    def skip_at_zero(ex: Any, spec: Any, page: int, p: int, rows: Any, codes: Any) -> None:
        if p > 0:
            write_tail(ex, spec, page, p, rows, codes)

    monkeypatch.setattr(EX, "write_tail", skip_at_zero)
    with pytest.raises(AssertionError, match=r"compressor_tail: the state read at P = 0 is not exact"):
        EX.main("tiny_v4")
    assert any(s.entry_kind is EntryKind.TAIL_ROW and s.compress_ratio == 4 for s in EX.setup("tiny_v4")[0].pools)


@pytest.mark.parametrize("doc", ["README.md", "docs/manager.md"])
def test_the_docs_show_the_examples_own_loop(doc: str) -> None:
    text = (ROOT / doc).read_text()
    assert "examples/manager_loop.py" in text
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    snippet = next(b for b in blocks if "manager.bindings()" in b and "manager.release(rid)" in b)
    code = {line.split("#")[0].strip() for line in EXAMPLE.read_text().splitlines()} - {""}
    for line in snippet.splitlines():
        stripped = line.split("#")[0].strip()
        if stripped and stripped != "..." and not stripped.startswith(("from ", "import ")):
            assert stripped in code, f"{doc}: {stripped!r} is not in examples/manager_loop.py"
    for verb in ("add_request", "match", "acquire", "request_tokens", "allocate", "complete", "commit",
                 "append_tokens", "release", "bind"):
        assert f".{verb}(" in snippet, verb
