"""The backends the differential tests run the CudaExecutor on: the NumPy stand-in always, CuPy with a GPU."""

from __future__ import annotations

import pytest

from hkv_core.errors import MissingDependency, NoDevice
from hkv_exec_cuda import Backend, cupy_backend, numpy_backend


def gpu_backend() -> Backend:
    """CuPy on the GPU, or a skip that says why there is none."""
    try:
        return cupy_backend()
    except (MissingDependency, NoDevice) as err:
        pytest.skip(f"needs a CUDA device and CuPy (scripts/gpu_check.sh installs the cuda extra): {err}")


BACKENDS = [
    pytest.param(numpy_backend, id="numpy-stand-in"),
    pytest.param(gpu_backend, id="cupy-gpu", marks=pytest.mark.gpu),
]
