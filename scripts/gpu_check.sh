#!/usr/bin/env sh
# On a machine with an NVIDIA GPU: set up .venv with the CuPy build for the driver's CUDA major version, run the
# GPU tests (pytest -m gpu) and benchmarks/bench_cuda.py, and print one summary table.  Five minutes in all.
#
#   sh scripts/gpu_check.sh [--no-install]      # --no-install: use .venv as it is (no pip)
#
# Figures and logs go to $OUT_DIR (default out/gpu_check); GPU_CHECK_BUDGET_S changes the 300 s budget.
# Exit 0: tests passed and the benchmark ran (its targets are reported, never enforced); 1: a test failed or the
# benchmark failed (a kernel check included); 2: no usable GPU, or the environment could not be set up; 124: out
# of time.
set -eu
cd "$(dirname "$0")/.."

BUDGET_S=${GPU_CHECK_BUDGET_S:-300}
OUT_DIR=${OUT_DIR:-out/gpu_check}
INSTALL=1
for arg in "$@"; do
  case "$arg" in
    --no-install) INSTALL=0 ;;
    *) echo "usage: sh scripts/gpu_check.sh [--no-install]" >&2; exit 2 ;;
  esac
done

START=$(date +%s)
left_s() { echo $((BUDGET_S - ($(date +%s) - START))); }
within() {  # within WHAT CMD...: run CMD with the time left of the budget
  what=$1; shift
  s=$(left_s)
  if [ "$s" -le 0 ]; then echo "gpu_check: out of time before $what" >&2; return 124; fi
  timeout "$s" "$@"
}
say() { echo "== $*" >&2; }
fail_setup() { rc=$?; echo "gpu_check: $1 failed (exit $rc)" >&2; exit 2; }

# -- the GPU and its driver's CUDA version
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu_check: nvidia-smi not found: this machine has no NVIDIA GPU driver, nothing to check here" >&2
  echo "gpu_check: (CPU checks: sh scripts/test.sh; benchmarks/bench_cuda.py --backend numpy)" >&2
  exit 2
fi
if ! smi=$(timeout 30 nvidia-smi 2>&1); then
  echo "gpu_check: nvidia-smi failed: $smi" >&2
  exit 2
fi
cuda_major=$(printf '%s\n' "$smi" | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\)\..*/\1/p' | head -n 1)
case "$cuda_major" in
  12) extra=cuda12 ;;
  13) extra=cuda13 ;;
  '') echo "gpu_check: no 'CUDA Version: N.x' line in nvidia-smi's output" >&2; exit 2 ;;
  *)
    if [ "$cuda_major" -gt 13 ]; then extra=cuda13  # newer drivers run CUDA 13 builds
    else echo "gpu_check: the driver supports CUDA $cuda_major; CuPy here needs 12 or later" >&2; exit 2; fi ;;
esac
gpu=$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)
say "GPU: ${gpu:-unknown}; driver CUDA $cuda_major; extra .[$extra]"
mkdir -p "$OUT_DIR"
PY=.venv/bin/python

# -- the environment: scripts/setup.sh's .venv (.[dev]), then the CuPy extra
probe() {  # CuPy imports, sees a device and compiles a kernel (NVRTC)
  within "the CuPy probe" "$PY" -c "import cupy; x = cupy.arange(8); assert int((x * 2).sum()) == 56" \
    >"$OUT_DIR/probe.log" 2>&1
}
if [ "$INSTALL" -eq 1 ]; then
  say "setting up .venv (scripts/setup.sh, then pip install -e '.[$extra]')"
  within "setup" sh scripts/setup.sh || fail_setup "scripts/setup.sh"
  other=$([ "$extra" = cuda13 ] && echo cupy-cuda12x || echo cupy-cuda13x)
  within "pip uninstall" "$PY" -m pip uninstall --quiet --yes "$other" >/dev/null 2>&1 || true  # one cupy only
  within "pip install" "$PY" -m pip install --quiet -e ".[$extra]" >&2 || fail_setup "pip install -e '.[$extra]'"
  if ! probe; then  # the wheel needs a CUDA toolkit; [ctk] brings its components from the package index
    say "CuPy cannot compile without a CUDA toolkit here: pip install 'cupy-${extra}x[ctk]'"
    within "pip install [ctk]" "$PY" -m pip install --quiet "cupy-${extra}x[ctk]" >&2 || fail_setup "the [ctk] install"
  fi
elif [ ! -x "$PY" ]; then
  echo "gpu_check: --no-install, but there is no .venv: run without --no-install (or sh scripts/setup.sh)" >&2
  exit 2
fi
if ! probe; then
  echo "gpu_check: CuPy does not work on this GPU ($OUT_DIR/probe.log):" >&2
  tail -n 5 "$OUT_DIR/probe.log" >&2
  exit 2
fi

# -- GPU tests (the suites of this checkout), then the benchmark
suites=""
for suite in tests/differential tests/executor; do
  if [ -d "$suite" ]; then suites="$suites $suite"; else say "$suite is not in this checkout: not run"; fi
done
say "pytest -m gpu$suites"
test_rc=0
rm -f "$OUT_DIR/pytest.xml"
# shellcheck disable=SC2086  # $suites is a list of paths without spaces
within "pytest" "$PY" -m pytest -m gpu $suites -q --junitxml "$OUT_DIR/pytest.xml" >"$OUT_DIR/pytest.log" 2>&1 \
  || test_rc=$?
tail -n 15 "$OUT_DIR/pytest.log" >&2
say "benchmarks/bench_cuda.py"
bench_rc=0
rm -f "$OUT_DIR/bench_cuda.json"
within "bench_cuda" "$PY" benchmarks/bench_cuda.py --json-out "$OUT_DIR/bench_cuda.json" \
  >"$OUT_DIR/bench_cuda.txt" 2>&1 || bench_rc=$?
cat "$OUT_DIR/bench_cuda.txt" >&2

# -- one summary table
"$PY" - "$OUT_DIR" "$test_rc" "$bench_rc" "${gpu:-unknown}" "$cuda_major" "$extra" <<'EOF'
import json, sys
import xml.etree.ElementTree as ET
from pathlib import Path
from rich.console import Console
from rich.markup import escape
from rich.table import Table

out, test_rc, bench_rc, gpu, cuda, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:]


def test_counts() -> str:
    path = Path(out, "pytest.xml")
    if not path.exists():
        return "no report"
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    return f"{passed} passed, {n['failures']} failed, {n['errors']} errors, {n['skipped']} skipped"


table = Table(title=escape(f"gpu_check: {gpu}, driver CUDA {cuda}, .[{extra}]"))
for column in ("check", "result", "ratio", "target 0.7 met"):
    table.add_column(column)
verdict = "ok" if test_rc == 0 else ("no GPU test collected" if test_rc == 5 else f"FAILED (exit {test_rc})")
table.add_row("pytest -m gpu", f"{test_counts()}: {verdict}", "", "")
figures = Path(out, "bench_cuda.json")
if figures.exists():
    for row in json.loads(figures.read_text())["rows"]:
        met = "baseline" if row["met"] is None else ("yes" if row["met"] else "NO")
        name = escape(f"{row['section']}: {row['name']}")
        table.add_row(name, f"{row['gbps']:.1f} GB/s", f"{row['ratio']:.2f}", met)
table.add_row("bench_cuda", "ok" if bench_rc == 0 else f"FAILED (exit {bench_rc})", "", "")
Console(width=110).print(table)
EOF

if [ "$test_rc" -eq 124 ] || [ "$bench_rc" -eq 124 ]; then exit 124; fi
if [ "$test_rc" -ne 0 ] || [ "$bench_rc" -ne 0 ]; then exit 1; fi
exit 0
