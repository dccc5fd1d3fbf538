"""The command line never shows a traceback: every bad input is one clear line (or JSON with --json) and a
documented exit status; the bounds are in --help; every command's --json parses."""

from __future__ import annotations

import json
import math
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hkv_cli import check_cmd, replay_cmd
from hkv_cli.errors import FAILED, INTERNAL, INTERRUPTED, USAGE, OutputPathError, output_folder
from hkv_cli.main import run, wants_json
from hkv_cli.output import print_error, print_json
from hkv_core.layout.bounds import CONFIG_FILE_BYTES_MAX


def hkv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hkv_cli.main", *args], capture_output=True, text=True)


def no_traceback(text: str) -> None:
    assert "Traceback" not in text and 'File "' not in text, text


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, str]:
    """Bad files and paths: a plain file where a folder is wanted, a binary, broken TOML, a FIFO, ..."""
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder\n")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(bytes(range(256)))
    broken = tmp_path / "broken.toml"
    broken.write_text("[[[")
    wrong = tmp_path / "wrong.toml"
    wrong.write_text("kinds = 3\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)  # a RecursionError in the JSON reader
    big = tmp_path / "big.json"
    with big.open("wb") as handle:
        handle.truncate(CONFIG_FILE_BYTES_MAX + 1)  # sparse
    return {"file": str(a_file), "under_file": str(a_file / "sub"), "binary": str(binary), "broken": str(broken),
            "wrong": str(wrong), "empty": os.devnull, "fifo": str(fifo), "dir": str(tmp_path),
            "missing": str(tmp_path / "missing.toml"), "missing_json": str(tmp_path / "missing.json"),
            "deep": str(deep), "big": str(big), "zero": "/dev/zero"}


# (arguments, the error type expected); every one exits 2.  Paths are keys of `files`, spelled {name}.
BAD_INPUTS = [
    (["demo", "--seed", "-1"], "BadParameter"),
    (["inspect", "tiny_v4", "--tokens", str(2**28 + 1)], "BadParameter"),
    (["inspect", "tiny_v4", "--tokens", "-1"], "BadParameter"),
    (["demo", "--seed", str(2**64)], "BadParameter"),
    (["demo", "--seed", "1.5"], "BadParameter"),
    (["demo", "--requests", "0"], "BadParameter"),
    (["demo", "--requests", "100000000"], "BadParameter"),
    (["demo", "--requests", "many"], "BadParameter"),
    (["demo", "--out", "{file}"], "BadParameter"),
    (["demo", "--out", "{under_file}"], "OutputPathError"),
    (["demo", "--out", "/proc/hkv-cannot-be-made"], "OutputPathError"),
    (["demo", "--fault", "no_such_fault"], "BadParameter"),
    (["demo", "--no-such-option"], "NoSuchOption"),
    (["check", "--prefixes", "0"], "BadParameter"),
    (["check", "--prefixes", "5"], "BadParameter"),
    (["check", "--prefixes", "two"], "BadParameter"),
    (["check", "--seeded", "-1"], "BadParameter"),
    (["check", "--requests", "0"], "BadParameter"),
    (["check", "--requests", "5"], "BadParameter"),
    (["check", "--slots", "-3"], "BadParameter"),
    (["check", "--slots", "31"], "BadParameter"),
    (["check", "--depth", "-1"], "BadParameter"),
    (["check", "--depth", "65"], "BadParameter"),
    (["check", "--depth", "99999999999999999999999"], "BadParameter"),
    (["check", "--max-states", "0"], "BadParameter"),
    (["check", "--max-states", "2000001"], "BadParameter"),
    (["check", "--impl-depth", "-1"], "BadParameter"),
    (["check", "--impl-depth", "13"], "BadParameter"),
    (["check", "--impl-max-states", "0"], "BadParameter"),
    (["check", "--impl-max-states", "50001"], "BadParameter"),
    (["check", "--spec", "{missing}"], "SpecError"),
    (["check", "--spec", "{dir}"], "BadParameter"),
    (["check", "--spec", "{binary}"], "SpecError"),
    (["check", "--spec", "{broken}"], "SpecError"),
    (["check", "--spec", "{wrong}"], "SpecError"),
    (["check", "--spec", "{empty}"], "SpecError"),
    (["check", "--spec", "{fifo}"], "SpecError"),
    (["spec", "diagram", "--out", "{file}"], "BadParameter"),
    (["spec", "diagram", "--out", "{under_file}"], "OutputPathError"),
    (["spec", "diagram", "--format", "gif"], "BadParameter"),
    (["spec", "nothing"], "NoSuchCommand"),
    (["inspect"], "MissingParameter"),
    (["inspect", "no_such_preset"], "ConfigError"),
    (["inspect", "{missing_json}"], "ConfigError"),
    (["inspect", "{dir}"], "ConfigError"),
    (["inspect", "{binary}"], "ConfigError"),
    (["inspect", "{file}"], "ConfigError"),
    (["inspect", "{fifo}"], "ConfigError"),
    (["inspect", "{deep}"], "ConfigError"),
    (["inspect", "{big}"], "ConfigError"),
    (["inspect", "{zero}"], "ConfigError"),
    (["inspect", "tiny_v4", "--tokens", "-1"], "BadParameter"),
    (["no_such_command"], "NoSuchCommand"),
    (["replay", "{file}", "--host-tokens", str(2**40 + 1)], "BadParameter"),  # issue 27 (12): no upper bound
    (["replay", "{file}", "--disk-tokens", str(2**40 + 1)], "BadParameter"),
    (["replay", "{file}", "--sweep", "--out", "{under_file}"], "OutputPathError"),  # before the trace is read
]


@pytest.mark.parametrize(("args", "error_type"), BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_json_error_with_exit_2(args: list[str], error_type: str, files: dict[str, str],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert run([a.format(**files) for a in args] + ["--json"]) == USAGE
    captured = capsys.readouterr()
    no_traceback(captured.out + captured.err)
    error = json.loads(captured.out)["error"]
    assert error["type"] == error_type, error
    assert error["message"] and error["exit_status"] == USAGE and isinstance(error["fields"], dict)


@pytest.mark.parametrize(("args", "error_type"), BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_without_json_is_a_short_message(args: list[str], error_type: str, files: dict[str, str],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert run([a.format(**files) for a in args]) == USAGE
    captured = capsys.readouterr()
    no_traceback(captured.out + captured.err)
    assert captured.out == ""
    if error_type in ("SpecError", "ConfigError", "OutputPathError"):  # ours: one line naming the type
        assert captured.err.count("\n") == 1 and f"({error_type})" in captured.err, captured.err
    else:  # click's: usage, a hint and one 'Error:' line
        assert "Error:" in captured.err and len(captured.err.splitlines()) <= 6, captured.err


@pytest.mark.parametrize(("name", "reason"), [("deep", "nested too deeply"), ("zero", "not a regular file"),
                                            ("fifo", "not a regular file"), ("big", "more than 16,777,216 bytes")])
def test_inspect_says_why_a_file_is_no_config(name: str, reason: str, files: dict[str, str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["inspect", files[name], "--json"]) == USAGE
    error = json.loads(capsys.readouterr().out)["error"]
    assert reason in error["message"] and "no such" not in error["message"], error


def _at_most_4_gib() -> None:  # a replay that reads /dev/zero whole fails here instead of taking the machine
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.mark.parametrize("name", ["zero", "fifo", "dir"])
def test_replay_refuses_what_is_not_a_regular_file(name: str, files: dict[str, str]) -> None:
    """issue 27 (1, 2): `hkv replay /dev/zero` read until memory ran out, `hkv replay FIFO` waited forever."""
    done = subprocess.run([sys.executable, "-m", "hkv_cli.main", "replay", files[name], "--json"],
                          capture_output=True, text=True, timeout=60, preexec_fn=_at_most_4_gib)
    assert done.returncode == USAGE, done.stdout + done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["type"] in ("ConfigError", "BadParameter"), error
    assert "not a regular file" in error["message"] or "is a directory" in error["message"], error


@pytest.mark.parametrize("instances", [[], ["--instances", "2"]], ids=["policies", "cluster"])
def test_replay_sweep_checks_its_out_folder_before_the_sweep(instances: list[str], files: dict[str, str],
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """issue 27 (12): an unwritable --out was found after the whole sweep (17.5 s)."""
    def no_sweep(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the sweep started")

    monkeypatch.setattr(replay_cmd, "replay", no_sweep)
    monkeypatch.setattr(replay_cmd, "cluster_results", no_sweep)
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}\n')
    args = ["replay", str(trace), "--block-tokens", "4", "--sweep", *instances, "--json"]
    for out, reason in ((files["under_file"], "Not a directory"), (os.devnull, "Not a directory")):
        assert run([*args, "--out", out]) == USAGE
        error = json.loads(capsys.readouterr().out)["error"]
        assert error["type"] == "OutputPathError" and error["fields"]["reason"] == reason, error


def test_output_path_errors_name_option_path_and_reason(files: dict[str, str]) -> None:
    with pytest.raises(OutputPathError) as err:
        output_folder("--out", Path(files["under_file"]))
    assert err.value.fields == {"option": "--out", "path": files["under_file"], "reason": "Not a directory",
                                "errno": 20}
    with pytest.raises(OutputPathError) as err:  # issue 27: said "File exists"
        output_folder("--out", Path(os.devnull))
    assert err.value.fields == {"option": "--out", "path": os.devnull, "reason": "Not a directory", "errno": 20}


def test_the_real_process_prints_no_traceback_and_json_on_stdout(files: dict[str, str]) -> None:
    done = hkv("demo", "--requests", "1", "--out", files["under_file"], "--json")
    assert done.returncode == USAGE
    no_traceback(done.stdout + done.stderr)
    assert json.loads(done.stdout)["error"]["fields"]["path"] == files["under_file"]
    done = hkv("check", "--depth", "-1")
    assert done.returncode == USAGE and "--depth" in done.stderr and "0<=x<=64" in done.stderr
    no_traceback(done.stderr)


def test_an_unexpected_exception_is_one_line_with_exit_70(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(check_cmd, "check", broken)
    monkeypatch.delenv("HKV_TRACEBACK", raising=False)
    assert run(["check", "--impl-depth", "0"]) == INTERNAL
    captured = capsys.readouterr()
    no_traceback(captured.err)
    assert "internal error: RuntimeError" in captured.err and "boom" in captured.err
    assert "HKV_TRACEBACK=1" in captured.err
    assert run(["check", "--impl-depth", "0", "--json"]) == INTERNAL
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["type"] == "internal error: RuntimeError" and error["exit_status"] == INTERNAL
    monkeypatch.setenv("HKV_TRACEBACK", "1")
    assert run(["check", "--impl-depth", "0"]) == INTERNAL
    assert "Traceback" in capsys.readouterr().err  # asked for: shown


def test_a_closed_stdout_stops_quietly_with_1() -> None:
    reader = subprocess.Popen([sys.executable, "-m", "hkv_cli.main", "inspect", "deepseek_v4_flash",
                               "--tokens", "1000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert reader.stdout is not None and reader.stderr is not None
    reader.stdout.close()  # before the child writes: its first write meets a closed pipe
    err = reader.stderr.read().decode()
    assert reader.wait() == FAILED, err
    no_traceback(err)
    assert err == ""


def strict_json(text: str) -> object:
    """`text` parsed as strict JSON: a bare NaN or Infinity fails the test."""
    def refuse(name: str) -> object:
        raise AssertionError(f"not strict JSON: {name} in {text}")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("args", [["--draft-k", "4", "--accept-probability", "nan"], ["--accept-probability", "nan"],
                                  ["--accept-probability", "NaN"], ["--accept-probability", "-inf"]])
def test_a_nan_accept_probability_is_refused_in_strict_json(args: list[str], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """issue 27 (3): the error wrote a bare NaN; without --draft-k, nan passed the 0<=x<=1 range."""
    assert run(["demo", "--requests", "1", "--out", str(tmp_path), *args, "--json"]) == USAGE
    error = strict_json(capsys.readouterr().out)["error"]  # type: ignore[index]
    assert error["type"] == "BadParameter" and error["fields"] == {"param": "--accept-probability"}, error
    assert "0.0<=x<=1.0" in error["message"] and not list(tmp_path.iterdir())


def test_json_output_and_errors_are_strict_json(capsys: pytest.CaptureFixture[str]) -> None:
    print_json({"a": math.nan, "b": [math.inf, -math.inf, 0.5], "c": {"d": (1, math.nan)}})
    assert strict_json(capsys.readouterr().out) == {"a": "nan", "b": ["inf", "-inf", 0.5], "c": {"d": [1, "nan"]}}
    print_error("InvalidArgument", "value=nan", {"value": math.nan}, USAGE, as_json=True)
    assert strict_json(capsys.readouterr().out)["error"]["fields"] == {"value": "nan"}  # type: ignore[index]


def test_json_is_asked_for_only_before_a_double_dash() -> None:
    assert wants_json(["check", "--json"]) and not wants_json(["inspect", "--", "--json"])
    assert not wants_json(["check"])


def test_help_shows_every_bound_and_the_exit_statuses() -> None:
    check_help = " ".join(hkv("check", "--help").stdout.split())
    for shown in ("1<=x<=4", "1<=x<=30", "0<=x<=64", "1<=x<=2000000", "0<=x<=12", "1<=x<=50000",
                  "Exit statuses", "TRUNCATED", "Both checks use it"):
        assert shown in check_help, shown
    demo_help = " ".join(hkv("demo", "--help").stdout.split())
    assert "1<=x<=5000" in demo_help and "0<=x<=18446744073709551615" in demo_help
    assert "Exit statuses" in demo_help
    top = " ".join(hkv("--help").stdout.split())
    assert "Exit statuses" in top and "3 `hkv check`" in top


def test_every_command_takes_json_and_its_json_parses(tmp_path: Path) -> None:
    runs = {
        "demo": hkv("demo", "--requests", "2", "--out", str(tmp_path / "demo"), "--json"),
        "check": hkv("check", "--prefixes", "1", "--requests", "1", "--depth", "1", "--impl-depth", "1", "--json"),
        "inspect": hkv("inspect", "tiny_v4", "--tokens", "16", "--json"),
        "spec diagram": hkv("spec", "diagram", "--json"),
        "spec diagram --out": hkv("spec", "diagram", "--out", str(tmp_path / "diagram"), "--json"),
    }
    for name, done in runs.items():
        assert done.returncode == 0, (name, done.stderr)
        no_traceback(done.stderr)
        assert isinstance(json.loads(done.stdout), dict), name
    assert json.loads(runs["spec diagram"].stdout)["mermaid"].startswith("stateDiagram-v2")
    assert Path(json.loads(runs["spec diagram --out"].stdout)["files"][0]).exists()
    assert json.loads(runs["check"].stdout)["status"] == "ok"


def test_ctrl_c_is_one_line_with_exit_130() -> None:
    # As a terminal starts it: Python's Ctrl-C handler on (a test run started in the background by a shell
    # without job control inherits SIGINT ignored, and Python then leaves it ignored).
    start = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
             "sys.argv = ['hkv', 'check', '--json']; runpy.run_module('hkv_cli.main', run_name='__main__')")
    running = subprocess.Popen([sys.executable, "-c", start], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    time.sleep(3)  # past the imports: inside the search
    running.send_signal(signal.SIGINT)
    out, err = running.communicate(timeout=60)
    assert running.returncode == INTERRUPTED, err
    no_traceback(out + err)
    assert json.loads(out)["error"]["type"] == "Interrupted"
