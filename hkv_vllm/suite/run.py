"""Run vLLM's own scheduler tests twice - stock, and with hkv's manager - and compare.

    python -m hkv_vllm.suite.run [--tests DIR] [--out DIR] [--json] [--baseline FILE]

Runs in .venv-vllm (scripts/vllm_suite.sh sets it up).  Each run is one
pytest process over the pinned release's test files, with the config-only
hub cache (`hub_cache.py`); the second loads `hkv_vllm.suite.plugin`.
Prints pass counts side by side, the reason class of every test that fails
only with hkv (`results.py`), and the behaviour differences by name.  With
`--baseline` (a summary written earlier), exit 1 when hkv passes fewer tests
of a file than the baseline did: a regression.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from hkv_vllm.suite.hub_cache import write_hub_cache
from hkv_vllm.suite.results import Comparison, compare, read_junit

TEST_FILES = ("test_scheduler.py", "test_async_scheduler.py", "test_prefix_caching.py",  # in the release's v1/core
              "test_prefix_replay.py", "test_deferred_block_free.py", "test_swa_inflight_window_free.py",
              "test_worker_slot_overflow.py",
              # DeepSeek-V4 layouts: packed groups on one block pool, SlidingWindowMLASpec and CircularBufferSpec
              # (the V4.1 ring), fp8 caches, hash blocks finer than a group's block (hash_block_size)
              "test_contiguous_kv_packing.py", "test_kv_cache_utils.py", "test_single_type_kv_cache_manager.py",
              "test_mamba_align_chunk_split.py", "prefix_cache/test_partial_prefix_cache_hits.py",
              "prefix_cache/test_partial_prefix_cache_primitives.py",
              "prefix_cache/test_mamba_eagle_resume_checkpoint.py")
PLUGIN = "hkv_vllm.suite.plugin"


def run_both(src: Path, out: Path) -> tuple[Path, Path]:
    """The stock and the hkv run of TEST_FILES in `src`, side by side (one process each, one thread each: the
    two take about as long together as one alone on two cores); their JUnit XML files."""
    started = time.monotonic()
    print("== vLLM tests, stock and hkv manager side by side ...", file=sys.stderr, flush=True)
    runs = [_start(src, out, mode) for mode in ("stock", "hkv")]
    for mode, (proc, sink) in zip(("stock", "hkv"), runs, strict=True):
        rc = proc.wait()
        sink.close()
        print(f"   {mode} done in {time.monotonic() - started:.0f} s (pytest exit {rc}; log {out / f'{mode}.log'})",
              file=sys.stderr)
    found = []
    for mode in ("stock", "hkv"):
        if not (out / f"{mode}.xml").exists():
            raise SystemExit(f"pytest wrote no results ({mode}): see {out / f'{mode}.log'}")
        found.append(out / f"{mode}.xml")
    return found[0], found[1]


def _start(src: Path, out: Path, mode: str) -> tuple[subprocess.Popen[bytes], Any]:
    """One pytest process over TEST_FILES in `src` (mode 'stock' or 'hkv'), started; it and its log file."""
    xml, log = out / f"{mode}.xml", out / f"{mode}.log"
    root = Path(__file__).resolve().parents[2]  # the hkv checkout this runner is in, ahead of any installed one
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(out / "hub"),
               TRANSFORMERS_OFFLINE="1", PYTHONPATH=os.pathsep.join((str(src), str(root))), OMP_NUM_THREADS="1")
    files = [str(src / "tests" / "v1" / "core" / name) for name in TEST_FILES]
    args = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", "-W", "ignore",
            f"--junitxml={xml}"] + (["-p", PLUGIN] if mode == "hkv" else [])
    xml.unlink(missing_ok=True)
    sink = log.open("w")
    return subprocess.Popen(args, cwd=src, env=env, stdout=sink, stderr=subprocess.STDOUT), sink


def summary(result: Comparison, vllm_version: str) -> dict[str, Any]:
    data = attrs.asdict(result)
    data["vllm_version"] = vllm_version
    data["commit"] = _commit()
    return data


def print_table(result: Comparison) -> None:
    width = max(len("vLLM test file"), *(len(file) for file in result.files))
    print(f"{'vLLM test file':<{width}} {'stock':>12} {'with hkv':>12}")
    for file in result.files:
        (sp, sn), (hp, hn) = result.stock[file], result.hkv[file]
        print(f"{file:<{width}} {f'{sp}/{sn}':>12} {f'{hp}/{hn}':>12}")
    total = [sum(c[i] for c in result.stock.values()) for i in (0, 1)]
    mine = [sum(c[i] for c in result.hkv.values()) for i in (0, 1)]
    print(f"{'all':<{width}} {f'{total[0]}/{total[1]}':>12} {f'{mine[0]}/{mine[1]}':>12}")
    print("\nfailing only with hkv, by reason:")
    for kind, count in sorted(result.classes.items(), key=lambda kv: -kv[1]):
        print(f"  {count:>4}  {kind}")
    for test_id in result.differences:
        print(f"        behaviour difference: {test_id}")
    if result.hkv_only_passes:
        print(f"\npassing only with hkv: {len(result.hkv_only_passes)}")
    print(f"\nvLLM {', '.join(result.files)}: stock {total[0]} of {total[1]} pass, with hkv {mine[0]} of {mine[1]}")


def regressions(result: Comparison, baseline: dict[str, Any]) -> list[str]:
    """Files where hkv passes fewer tests than in the baseline summary."""
    was = baseline.get("hkv", {})
    return [f"{file}: {result.hkv[file][0]} passed, baseline {was[file][0]}"
            for file in result.files if file in was and result.hkv[file][0] < was[file][0]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=Path, default=Path(".vllm-src"), help="the unpacked release (holds tests/)")
    parser.add_argument("--out", type=Path, default=Path("out/vllm-suite"), help="where logs and results go")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--baseline", type=Path, help="a summary to compare against: exit 1 on fewer hkv passes")
    parser.add_argument("--save", type=Path, help="also write the summary here")
    args = parser.parse_args(argv)
    import vllm

    src, out = args.tests.resolve(), args.out.resolve()
    if not (src / "tests" / "v1" / "core").is_dir():
        parser.error(f"{src} holds no vLLM tests (v1/core under tests; run scripts/vllm_sources.sh)")
    out.mkdir(parents=True, exist_ok=True)
    write_hub_cache(out / "hub")
    stock, hkv = (read_junit(xml) for xml in run_both(src, out))
    result = compare(stock, hkv)
    data = summary(result, vllm.__version__)
    (out / "summary.json").write_text(json.dumps(data, indent=1) + "\n")
    if args.save:
        args.save.write_text(json.dumps(data, indent=1) + "\n")
    if args.json:
        print(json.dumps(data, indent=1))
    else:
        print_table(result)
    if args.baseline and args.baseline.exists():
        worse = regressions(result, json.loads(args.baseline.read_text()))
        for line in worse:
            print(f"regression: {line}", file=sys.stderr)
        return 1 if worse else 0
    return 0


def _commit() -> str:
    root = Path(__file__).parents[2]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "hkv_core", "hkv_vllm"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("-dirty" if dirty else "")


if __name__ == "__main__":
    raise SystemExit(main())
