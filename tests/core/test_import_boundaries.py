"""Import boundaries of hkv_core, checked in fresh interpreters and on the sources.

- hkv_core imports neither cupy nor torch (nor any executor);
- plans and the executor interface sit beside the manager: hkv_core.plan and
  hkv_core.executor import nothing from hkv_core.manager;
- hkv_exec_cuda and hkv_tiers load no hkv_exec_ref module (every module of each, in a fresh
  interpreter);
- role dispatch lives in the role objects: no module outside an explicit list
  mentions `PoolRole.` (the roles package, and lanes.py, which maps pools to
  roles).
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import hkv_core

PACKAGE = Path(hkv_core.__file__).parent
ROOT = PACKAGE.parent

PROBE = """
import importlib, pkgutil, sys
import hkv_core
for info in pkgutil.walk_packages(hkv_core.__path__, "hkv_core."):
    importlib.import_module(info.name)
bad = sorted(m for m in sys.modules if m.split(".")[0] in {"cupy", "torch", "hkv_exec_ref", "hkv_exec_cuda"})
print(",".join(bad))
"""

BESIDE_THE_MANAGER = ("hkv_core.plan", "hkv_core.executor")
BESIDE_PROBE = """
import sys
import {modules}
print(",".join(sorted(m for m in sys.modules if m == "hkv_core.manager" or m.startswith("hkv_core.manager."))))
"""

# Files that may name a PoolRole member (relative to the repository root).  Role dispatch ("if this pool
# is a window pool ...") belongs to the role objects; everything else asks the roles.
ROLE_FILES = frozenset({
    "hkv_core/manager/lanes.py",  # defines PoolRole and maps (object kind, entry kind) to a role
    "hkv_core/manager/roles/__init__.py",
    "hkv_core/manager/roles/base.py",
    "hkv_core/manager/roles/prefix.py",
    "hkv_core/manager/roles/window.py",
    "hkv_core/manager/roles/tail.py",
})
# Test oracles model the roles independently of the manager: they may name them (or not).
ORACLE_FILES = frozenset({"hkv_core/testing/manager_machine.py", "hkv_core/testing/brute_force.py"})
# Known exceptions in the manager outside the role objects, each with its reason.  The test asserts the
# exact set, so a new mention fails, and so does removing one of these without shrinking the list.
KNOWN_EXCEPTIONS: dict[str, str] = {}


def run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_hkv_core_imports_no_cupy_torch_or_executor() -> None:
    found = run(PROBE)
    assert found == "", f"hkv_core pulled in: {found}"


def test_probe_can_see_a_forbidden_import() -> None:
    assert "hkv_exec_ref" in run(PROBE.replace("import hkv_core\n", "import hkv_core, hkv_exec_ref.tiny_v4\n"))


def test_plan_and_executor_load_no_manager_module() -> None:
    for module in BESIDE_THE_MANAGER:
        found = run(BESIDE_PROBE.format(modules=module))
        assert found == "", f"importing {module} loaded {found}"


def test_beside_probe_can_see_a_manager_import() -> None:
    assert "hkv_core.manager" in run(BESIDE_PROBE.format(modules="hkv_core.plan, hkv_core.manager.lanes")).split(",")


def imported_modules(path: Path) -> set[str]:
    """Every module a source file imports (absolute names; `TYPE_CHECKING` blocks and functions included)."""
    found = set[str]()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def manager_imports(path: Path) -> list[str]:
    return sorted(m for m in imported_modules(path) if m == "hkv_core.manager" or m.startswith("hkv_core.manager."))


def test_plan_and_executor_sources_import_nothing_from_the_manager() -> None:
    for module in BESIDE_THE_MANAGER:
        path = ROOT / (module.replace(".", "/") + ".py")
        assert path.exists() and not manager_imports(path), f"{module} imports {manager_imports(path)}"


def test_source_check_sees_a_manager_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from hkv_core.manager.core import Core\n\ndef f():\n    import hkv_core.manager\n")
    assert manager_imports(probe) == ["hkv_core.manager", "hkv_core.manager.core", "hkv_core.manager.core.Core"]


def mentions_of_pool_roles(package: Path) -> set[str]:
    return {str(p.relative_to(package.parent)) for p in package.rglob("*.py") if "PoolRole." in p.read_text()}


def test_role_dispatch_lives_in_the_role_objects() -> None:
    found = mentions_of_pool_roles(PACKAGE)
    assert {"hkv_core/manager/lanes.py", "hkv_core/manager/roles/__init__.py"} <= found, "the scan sees nothing"
    outside = found - ROLE_FILES - ORACLE_FILES
    assert outside == set(KNOWN_EXCEPTIONS), (
        f"modules outside the role objects naming PoolRole members: {sorted(outside - set(KNOWN_EXCEPTIONS))}; "
        f"exceptions no longer needed: {sorted(set(KNOWN_EXCEPTIONS) - outside)}")
    for name in ROLE_FILES | ORACLE_FILES | set(KNOWN_EXCEPTIONS):
        assert (ROOT / name).exists(), f"listed file {name} is gone: update the list"


def test_role_scan_sees_a_new_mention(tmp_path: Path) -> None:
    package = tmp_path / "hkv_core"
    (package / "manager").mkdir(parents=True)
    (package / "manager" / "verb.py").write_text("if pool.spec.role is PoolRole.WINDOW:\n    pass\n")
    (package / "manager" / "other.py").write_text("from hkv_core.manager.lanes import PoolRole\n")
    assert mentions_of_pool_roles(package) == {"hkv_core/manager/verb.py"}


PACKAGE_PROBE = """
import importlib, pkgutil, sys
import {package}
for info in pkgutil.walk_packages({package}.__path__, "{package}."):
    importlib.import_module(info.name)
print(",".join(sorted(m for m in sys.modules if m.split(".")[0] == "hkv_exec_ref")))
"""


@pytest.mark.parametrize("package", ["hkv_exec_cuda", "hkv_tiers"])
def test_cuda_executor_and_tiers_load_no_reference_module(package: str) -> None:
    """Every module of hkv_exec_cuda and of hkv_tiers loads in a fresh interpreter without hkv_exec_ref."""
    found = run(PACKAGE_PROBE.format(package=package))
    assert found == "", f"importing every module of {package} loaded {found}"


def test_package_probe_can_see_a_reference_import() -> None:
    probe = PACKAGE_PROBE.format(package="hkv_tiers")
    probe = probe.replace("import hkv_tiers\n", "import hkv_tiers, hkv_exec_ref\n", 1)
    assert "hkv_exec_ref" in run(probe)
