"""benchmarks/bench_remote.py runs: its quick mode gives every section with positive figures and its check passes.

It needs the `remote` extra (Mooncake's client and `mooncake_master`); without it the test skips, saying what
is missing.  Timings are not asserted (the benchmark's own rule): only that each figure is there and positive.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import MISSING

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # as when it runs as a script: bench_manager beside it
    spec = importlib.util.spec_from_file_location("bench_remote", BENCHMARKS / "bench_remote.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_remote", module)
    spec.loader.exec_module(module)
    return module


def test_quick_run_reports_every_section(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    if MISSING:
        pytest.skip(MISSING)
    bench = _bench(monkeypatch)
    stored = tmp_path / "bench_remote.json"
    assert bench.main(["--quick", "--json", "--json-out", str(stored)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert json.loads(stored.read_text()) == result
    assert result["records"] == 8 and result["runs"] == 1 and result["payload_kib"] == [64]
    assert result["target_ratio"] == 0.7 and len(result["commit"]) >= 7
    for section, registered in (("zero_copy", True), ("plain", False)):
        mode = result[section]
        assert mode["registered"] is registered, section
        assert mode["counts"]["published"] == mode["counts"]["loaded"] == 8, (section, mode["counts"])
        figures = mode["64KiB"]
        assert figures["payload_bytes"] == 64 * 1024
        for name in ("gbps", "put_gbps", "ratio"):
            assert figures["publish"][name] > 0, (section, "publish", name)
        for name in ("gbps", "get_gbps", "ratio", "batch_get_into_gbps", "ratio_batch_get_into"):
            assert figures["fetch"][name] > 0, (section, "fetch", name)
        for op in ("publish", "fetch"):
            assert figures[op]["pass"] is (figures[op]["ratio"] >= 0.7), (section, op)
        assert set(figures["seconds"]) == {"publish", "put", "fetch", "get", "batch_get_into"}
