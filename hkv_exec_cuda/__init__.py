"""CuPy/CUDA executor behind the narrow executor interface (docs/cuda_executor.md).

CuPy is an optional extra (`pip install 'hkv[cuda]'`, or `hkv[cuda13]` for a CUDA 13 driver) and is imported
only by `cupy_backend()`; `numpy_backend()` runs the same host-side logic on the CPU.
"""

from hkv_exec_cuda.backend import Backend, cupy_backend, default_backend, numpy_backend
from hkv_exec_cuda.executor import CudaExecutor, PendingPlan

__all__ = ["Backend", "CudaExecutor", "PendingPlan", "cupy_backend", "default_backend", "numpy_backend"]
