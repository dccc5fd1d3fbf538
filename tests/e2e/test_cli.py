"""The command line as a user runs it: exit codes, --json output, typed errors."""

import json
import subprocess
import sys
from pathlib import Path

from hkv_core.testing.spec_mutation import mutated_spec


def hkv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hkv_cli.main", *args], capture_output=True, text=True)


def test_inspect_flash_json_reports_the_v4_layout() -> None:
    done = hkv("inspect", "deepseek_v4_flash", "--tokens", "1000", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["main_layers"] == 43
    assert report["layers_by_kind"] == {"SWA": 2, "CSA": 21, "HCA": 20}
    assert report["window_tokens"] == 128
    groups = {g["kind"]: g for g in report["resume"]["groups"]}
    assert groups["CSA"]["compressed_entries"] == 250 and groups["HCA"]["compressed_entries"] == 7
    assert groups["CSA"]["indexer_keys"] == 250
    assert (groups["CSA"]["tail_rows"]["overlap"], groups["CSA"]["tail_rows"]["remainder"]) == (4, 0)
    assert groups["HCA"]["tail_rows"]["total"] == 104
    assert {g["window_rows"] for g in groups.values()} == {127}


def test_check_json_fields_on_a_small_bound() -> None:
    done = hkv("check", "--prefixes", "1", "--requests", "1", "--depth", "2", "--impl-depth", "3", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    for key in ("states_explored", "transitions_explored", "invariants_checked", "violations", "bound"):
        assert key in result
    for key in ("states_explored", "calls_explored", "invariants_checked", "violations", "bound"):
        assert key in result["implementation"]
    assert result["states_explored"] > 1 and result["violations"] == []
    assert result["bound"]["prefixes"] == 1 and result["bound"]["seeded_prefixes"] == 1  # at most --prefixes
    assert result["bound"]["device_slots"] == 8
    assert result["implementation"]["states_explored"] > 1 and result["implementation"]["violations"] == []
    assert result["implementation"]["bound"]["max_depth"] == 3


def test_check_table_output_and_skipping_the_manager() -> None:
    done = hkv("check", "--prefixes", "1", "--seeded", "0", "--requests", "1", "--depth", "2", "--impl-depth", "0")
    assert done.returncode == 0, done.stderr
    assert "hkv check: lifecycle spec" in done.stdout and "states explored" in done.stdout
    assert "CacheManager" not in done.stdout


def test_check_refuses_a_bound_out_of_range() -> None:
    done = hkv("check", "--prefixes", "9", "--json")
    assert done.returncode == 2 and "--prefixes" in done.stderr


def test_check_exits_1_and_prints_trace_on_a_broken_spec(tmp_path: Path) -> None:
    path = mutated_spec(tmp_path, 'event = "evict", dest = "FREE", guards = ["unpinned", "unheld"]',
                        'event = "evict", dest = "FREE", guards = ["unheld"]')
    done = hkv("check", "--spec", str(path), "--prefixes", "1", "--requests", "1", "--impl-depth", "0", "--json")
    assert done.returncode == 1
    violations = json.loads(done.stdout)["violations"]
    assert violations and violations[0]["trace"]
    assert any(v["invariant"] == "pinned_never_freed" for v in violations), violations


def test_bad_preset_is_a_typed_error_with_exit_2() -> None:
    done = hkv("inspect", "no_such_model", "--json")
    assert done.returncode == 2
    error = json.loads(done.stdout)
    assert error["error"] == "ConfigError" and "no_such_model" in error["message"]


def test_spec_diagram_is_mermaid_with_every_kind() -> None:
    done = hkv("spec", "diagram")
    assert done.returncode == 0
    assert done.stdout.startswith("stateDiagram-v2")
    for kind in ("compressed_kv", "compressor_tail", "swa_window", "indexer_state", "disk_prefix"):
        assert f"state {kind} {{" in done.stdout
