"""The command line as a user runs it: exit codes, --json output, typed errors."""

import json
import os
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
    assert result["bound"]["device_slots"] == 10
    assert result["implementation"]["states_explored"] > 1 and result["implementation"]["violations"] == []
    assert result["implementation"]["bound"]["max_depth"] == 3
    # one search per layout: tiny_csa (every attention kind), tiny_linear (a hybrid's recurrent state), and
    # tiny_csa with its pools drawing from one shared block space
    assert [(i["bound"]["layout"], i["bound"]["shared_pages"]) for i in result["implementations"]] == [
        ("tiny_csa", None), ("tiny_linear", None), ("tiny_csa", 20)]
    assert result["implementations"][0] == result["implementation"]
    assert all(i["violations"] == [] and i["states_explored"] > 1 for i in result["implementations"])
    assert any(t.startswith("recurrent_state.") for t in result["implementations"][1]["transitions_taken"])


def test_check_table_output_and_skipping_the_manager() -> None:
    done = hkv("check", "--prefixes", "1", "--seeded", "0", "--requests", "1", "--depth", "2", "--impl-depth", "0")
    assert done.returncode == 0, done.stderr
    assert "hkv check: lifecycle spec" in done.stdout and "states explored" in done.stdout
    assert "CacheManager" not in done.stdout


def test_check_refuses_a_bound_out_of_range() -> None:
    done = hkv("check", "--prefixes", "9", "--json")
    assert done.returncode == 2 and done.stderr == ""
    error = json.loads(done.stdout)["error"]
    assert error["type"] == "BadParameter" and error["fields"] == {"param": "--prefixes"}
    assert "1<=x<=4" in error["message"]
    done = hkv("check", "--prefixes", "9")
    assert done.returncode == 2 and "--prefixes" in done.stderr and done.stdout == ""


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
    error = json.loads(done.stdout)["error"]
    assert error["type"] == "ConfigError" and "no_such_model" in error["message"]
    assert error["fields"]["source"] == "no_such_model" and error["exit_status"] == 2


def test_spec_diagram_is_mermaid_with_every_kind() -> None:
    done = hkv("spec", "diagram")
    assert done.returncode == 0
    assert done.stdout.startswith("stateDiagram-v2")
    for kind in ("compressed_kv", "compressor_tail", "swa_window", "indexer_state", "tier_load"):
        assert f"state {kind} {{" in done.stdout


def test_check_at_its_state_cap_says_truncated_and_exits_3() -> None:
    done = hkv("check", "--max-states", "50", "--impl-depth", "0")
    assert done.returncode == 3, done.stderr
    assert "TRUNCATED at the state cap (50)" in done.stdout and "no verdict" in done.stdout
    done = hkv("check", "--max-states", "50", "--impl-depth", "0", "--json")
    assert done.returncode == 3
    result = json.loads(done.stdout)
    assert result["truncated"] is True and result["states_explored"] == 50
    assert result["status"] == "truncated" and result["exit_status"] == 3 and result["violations"] == []


def test_the_implementation_check_at_its_state_cap_says_truncated() -> None:
    done = hkv("check", "--depth", "0", "--impl-depth", "4", "--impl-max-states", "30", "--json")
    assert done.returncode == 3, done.stderr
    result = json.loads(done.stdout)
    assert result["truncated"] is False and result["implementation"]["truncated"] is True
    assert result["implementation"]["states_explored"] == 30 and result["status"] == "truncated"
    table = hkv("check", "--depth", "0", "--impl-depth", "4", "--impl-max-states", "30")
    assert table.returncode == 3 and table.stdout.count("TRUNCATED at the state cap") == 3  # each search's
    assert "complete (whole bound)" in table.stdout  # the abstract check, not truncated


def test_check_spec_applies_to_the_implementation_check(tmp_path: Path) -> None:
    """A spec without the event `retire` passes the abstract check but the manager (which retires window
    pages) cannot run on it: with --impl-depth the check says so; without, it never looks."""
    path = mutated_spec(tmp_path, 'event = "retire"', 'event = "expire"')
    small = ("check", "--spec", str(path), "--prefixes", "1", "--requests", "1", "--depth", "2")
    abstract_only = hkv(*small, "--impl-depth", "0", "--json")
    assert abstract_only.returncode == 0, abstract_only.stdout
    assert json.loads(abstract_only.stdout)["spec"] == str(path)
    both = hkv(*small, "--impl-depth", "1", "--json")
    assert both.returncode == 2
    error = json.loads(both.stdout)["error"]
    assert error["type"] == "SpecError" and "retire" in error["message"]
    assert error["fields"]["table"] == "kinds.swa_window"
    shipped = hkv("check", "--prefixes", "1", "--requests", "1", "--depth", "1", "--impl-depth", "1")
    assert shipped.returncode == 0 and "(both checks)" in shipped.stdout


def test_paths_with_brackets_print_as_written(tmp_path: Path) -> None:
    path = mutated_spec(tmp_path, 'event = "retire"', 'event = "retire"')  # the shipped spec, copied
    bracketed = path.rename(tmp_path / "life[bold]cycle.toml")
    done = hkv("check", "--spec", str(bracketed), "--prefixes", "1", "--requests", "1", "--depth", "1",
               "--impl-depth", "0")
    assert done.returncode == 0, done.stderr
    assert "life[bold]cycle.toml" in " ".join(done.stdout.split()).replace(" ", "")


def test_replay_json_and_a_malformed_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    lines = [{"timestamp": i, "input_length": 5, "output_length": 1, "hash_ids": [ord(c), 1000 + i]}
             for i, c in enumerate("ABCADAB")]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = hkv("replay", str(trace), "--block-tokens", "4", "--capacity-tokens", "16", "--policy", "lru",
               "--policy", "belady", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["hit_blocks"], out["blocks"]) == (2, 14) and [r["policy"] for r in out["results"]] == ["lru", "belady"]
    assert out["results"][1]["hit_blocks"] == 3 and out["block_hit_rate"] == round(2 / 14, 4)
    trace.write_text(json.dumps(lines[0]) + "\n{broken\n")
    bad = hkv("replay", str(trace), "--block-tokens", "4", "--json")
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["fields"]["key"] == "line"
    assert hkv("replay", str(trace), "--capacity-tokens", "lots").returncode == 2


def test_replay_at_a_memory_budget(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    lines = [{"timestamp": i, "input_length": 81, "output_length": 1,
              "hash_ids": list(range(100 * (i % 3), 100 * (i % 3) + 21))} for i in range(12)]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    gib = str(40_000 / (1 << 30))  # 1 KB a point, 64 B a token
    done = hkv("replay", str(trace), "--layout", "tiny_linear", "--block-tokens", "4", "--memory-gib", gib, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["memory_bytes"] == 40_000 and 0 < out["device_bytes"] <= 40_000 and out["hit_tokens"] > 0
    small = hkv("replay", str(trace), "--layout", "tiny_linear", "--block-tokens", "4", "--memory-gib", "1e-6",
                "--json")
    assert small.returncode == 2 and json.loads(small.stdout)["error"]["fields"]["key"] == "memory_bytes"
    both = hkv("replay", str(trace), "--memory-gib", "1", "--capacity-tokens", "4096")
    assert both.returncode == 2 and "give one" in both.stderr



def test_tables_to_a_pipe_are_complete_not_cut_to_80_columns(tmp_path: Path) -> None:
    """issue 27 (11): piped or redirected, rich cut tables to 80 columns (`11,0…`) and wrapped paths mid-word."""
    folder = tmp_path / ("a-folder-whose-name-is-long-enough-that-a-path-in-it-passes-eighty-columns" * 2)
    folder.mkdir()
    trace = folder / "trace.jsonl"
    lines = [{"timestamp": i, "input_length": 5, "output_length": 1, "hash_ids": [ord(c), 1000 + i]}
             for i, c in enumerate("ABCADAB")]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # as `hkv ... | less` runs

    def piped(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "hkv_cli.main", *args], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        assert "…" not in done.stdout, done.stdout
        return done.stdout

    table = piped("replay", str(trace), "--block-tokens", "4", "--capacity-tokens", "8", "--host-tokens", "1000",
                  "--disk-tokens", "1000")
    header = next(line for line in table.splitlines() if "policy" in line)
    for column in ("capacity (blocks)", "block hit rate", "from host / disk (tokens)", "load / split / recompute"):
        assert column in header, table
    demo = piped("demo", "--requests", "2", "--out", str(folder))
    assert f"trace: {folder / 'demo_trace.jsonl'}" in demo.splitlines(), demo
    assert any("trace records, served in arrival order" in line for line in demo.splitlines()), demo
