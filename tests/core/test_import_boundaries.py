"""hkv_core imports neither cupy nor torch (nor any executor), in a fresh interpreter."""

import subprocess
import sys

PROBE = """
import importlib, pkgutil, sys
import hkv_core
for info in pkgutil.walk_packages(hkv_core.__path__, "hkv_core."):
    importlib.import_module(info.name)
bad = sorted(m for m in sys.modules if m.split(".")[0] in {"cupy", "torch", "hkv_exec_ref", "hkv_exec_cuda"})
print(",".join(bad))
"""


def test_hkv_core_imports_no_cupy_torch_or_executor() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "", f"hkv_core pulled in: {done.stdout.strip()}"


def test_probe_can_see_a_forbidden_import() -> None:
    probe = PROBE.replace("import hkv_core\n", "import hkv_core, hkv_exec_ref.tiny_v4\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "hkv_exec_ref" in done.stdout
