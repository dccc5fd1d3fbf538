"""Pinned host memory the executor hands out and recognises, and the staging buffer host copies go through.

A host array the executor allocated (`PinnedArrays.empty`) is page-locked: device
copies go straight into or out of it.  Any other host array is copied through one
reusable pinned staging buffer, in pieces of at most its size (docs/cuda_executor.md).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hkv_exec_cuda.backend import Backend

__all__ = ["PinnedArrays"]


class PinnedArrays:
    """Page-locked host arrays by address range, plus the shared staging buffer."""

    def __init__(self, backend: Backend, staging_bytes: int) -> None:
        assert staging_bytes > 0, staging_bytes
        self._backend = backend
        self._ranges: list[tuple[int, int, NDArray[np.uint8]]] = []  # (start, stop, buffer kept alive)
        self._ranges_lock = threading.Lock()  # `release` runs from PendingPlan.wait, outside the executor's lock
        self.staging = backend.pinned_empty(staging_bytes)
        self.staging_lock = threading.Lock()  # one user of the staging buffer at a time

    def empty(self, shape: tuple[int, ...], dtype: Any) -> NDArray[Any]:
        """A new page-locked host array (zeroed)."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        raw = self._backend.pinned_empty(max(nbytes, 1))
        raw[:] = 0
        start = self._backend.address(raw)
        with self._ranges_lock:
            self._ranges.append((start, start + raw.size, raw))
        out: NDArray[Any] = raw[:nbytes].view(dtype).reshape(shape)
        return out

    def release(self, array: NDArray[Any]) -> None:
        """Forget a pinned array from `empty` (its memory goes back to the pinned pool once unreferenced)."""
        start = int(array.__array_interface__["data"][0])
        with self._ranges_lock:
            self._ranges = [r for r in self._ranges if not r[0] <= start < r[1]]

    def holds(self, array: NDArray[Any]) -> bool:
        """Is `array` a C-contiguous view into memory this object pinned?"""
        if not array.flags.c_contiguous:
            return False
        start = int(array.__array_interface__["data"][0])
        with self._ranges_lock:
            return any(lo <= start and start + array.nbytes <= hi for lo, hi, _ in self._ranges)

    def staging_view(self, nbytes: int, dtype: Any, shape: tuple[int, ...]) -> NDArray[Any]:
        """The first `nbytes` of the staging buffer as an array (hold `staging_lock`)."""
        assert nbytes <= self.staging.size, (nbytes, self.staging.size)
        out: NDArray[Any] = self.staging[:nbytes].view(dtype).reshape(shape)
        return out
