"""Device backends: what CudaExecutor needs from CuPy, and a NumPy stand-in with the same shape.

The executor's host-side logic (checks, index arrays, staging, plan completions,
graph guards) is written once against `Backend`; `cupy_backend()` runs it on a
CUDA device, `numpy_backend()` runs the same code on the CPU so CI exercises it
without a GPU (docs/cuda_executor.md).  Nothing here imports CuPy until
`cupy_backend()` is called.

- `xp`: the array module (cupy or numpy); device arrays are its arrays.
- `empty_aligned(nbytes, alignment)`: one device buffer whose base is a multiple of `alignment`.
- `pinned_empty(nbytes)`: page-locked host memory (the stand-in: page-aligned NumPy memory).
- `stream()`: a stream; `with stream:` makes `xp` work run on it.  `record(stream)`: an event.
- `to_host(src, dst, stream)` / `to_device(src, dst, stream)`: asynchronous copies between a device
  array and a host array of the same shape and dtype (pinned for real overlap).
- `address(array)`: the base address of a device or host array.
- `free_bytes()`: memory a new device allocation can take now (None if unknown); `memory_name` says whose.
- `capture(stream, step)` -> a graph whose `launch(stream)` replays `step`'s work.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from hkv_core.errors import MissingDependency, NoDevice
from hkv_core.executor import available_host_bytes

__all__ = ["Backend", "CupyBackend", "Event", "Graph", "NumpyBackend", "Stream", "cupy_backend", "default_backend",
           "numpy_backend"]

HOST_PAGE_BYTES = 4096  # the stand-in's "pinned" buffers are aligned like O_DIRECT buffers


class Event(Protocol):
    """Marks the end of the work queued on a stream before it (a CUDA event)."""

    def done(self) -> bool: ...

    def synchronize(self) -> None: ...


class Stream(Protocol):
    """An ordered queue of device work; `with stream:` makes it current."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> Any: ...

    def synchronize(self) -> None: ...


class Graph(Protocol):
    """Captured device work, replayed by `launch`."""

    def launch(self, stream: Stream) -> None: ...


class Backend(Protocol):
    """What CudaExecutor needs from an array library (see the module's docstring)."""

    name: str
    xp: Any

    def empty_aligned(self, nbytes: int, alignment: int) -> Any: ...

    def pinned_empty(self, nbytes: int) -> NDArray[np.uint8]: ...

    def stream(self) -> Stream: ...

    def record(self, stream: Stream) -> Event: ...

    def to_host(self, src: Any, dst: NDArray[Any], stream: Stream) -> None: ...

    def to_device(self, src: NDArray[Any], dst: Any, stream: Stream) -> None: ...

    def address(self, array: Any) -> int: ...

    memory_name: str  # what `free_bytes` measures, for messages

    def free_bytes(self) -> int | None: ...

    def capture(self, stream: Stream, step: Callable[[], None]) -> Graph: ...

    def current_stream(self) -> Stream: ...

    def wait(self, waiter: Stream, on: Stream) -> None: ...


# -------------------------------------------------------------------- the NumPy stand-in


class _HostStream:
    """A stream on the CPU: work runs at once, in program order."""

    def __enter__(self) -> _HostStream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def synchronize(self) -> None:
        return None


class _DoneEvent:
    """An event on the CPU: the work before it has already run."""

    def done(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class _ReplayGraph:
    """A "captured" step on the CPU: replaying calls the step again (its buffers are the same arrays)."""

    def __init__(self, step: Callable[[], None]) -> None:
        self._step = step

    def launch(self, stream: Stream) -> None:
        self._step()


def _aligned_bytes(xp: Any, nbytes: int, alignment: int, address: Callable[[Any], int]) -> Any:
    """A uint8 array of `nbytes` whose first byte sits at a multiple of `alignment` (over-allocate, cut)."""
    raw = xp.zeros(nbytes + alignment, dtype=xp.uint8)
    offset = -address(raw) % alignment
    return raw[offset:offset + nbytes]


class NumpyBackend:
    """The CPU stand-in for CuPy: same calls, NumPy arrays, synchronous streams."""

    name = "numpy"
    xp: Any = np
    memory_name = "host memory available (MemAvailable; the stand-in's device is the host)"

    def free_bytes(self) -> int | None:
        return available_host_bytes()

    def empty_aligned(self, nbytes: int, alignment: int) -> NDArray[np.uint8]:
        out: NDArray[np.uint8] = _aligned_bytes(np, nbytes, alignment, self.address)
        return out

    def pinned_empty(self, nbytes: int) -> NDArray[np.uint8]:
        return self.empty_aligned(nbytes, HOST_PAGE_BYTES)

    def stream(self) -> _HostStream:
        return _HostStream()

    def record(self, stream: Stream) -> _DoneEvent:
        return _DoneEvent()

    def to_host(self, src: Any, dst: NDArray[Any], stream: Stream) -> None:
        np.copyto(dst, src)

    def to_device(self, src: NDArray[Any], dst: Any, stream: Stream) -> None:
        np.copyto(dst, src)

    def address(self, array: Any) -> int:
        return int(array.__array_interface__["data"][0])

    def capture(self, stream: Stream, step: Callable[[], None]) -> _ReplayGraph:
        step()  # a capture on a GPU records the work without running it; here, a warm run checks the step
        return _ReplayGraph(step)

    def current_stream(self) -> _HostStream:
        return _HostStream()

    def wait(self, waiter: Stream, on: Stream) -> None:
        return None  # work on the CPU is already in program order


# -------------------------------------------------------------------- CuPy


class CupyBackend:
    """CuPy on the current CUDA device: pinned staging, streams, events, CUDA Graph capture."""

    name = "cupy"
    memory_name = "free device memory (cudaMemGetInfo, plus CuPy's pool's cached blocks)"

    def __init__(self, cupy: Any) -> None:
        self.xp = cupy
        self._cuda = cupy.cuda

    def free_bytes(self) -> int | None:
        """The device's free memory, and what CuPy's memory pool holds free (it hands those blocks out first)."""
        free, _total = self._cuda.runtime.memGetInfo()
        return int(free) + int(self.xp.get_default_memory_pool().free_bytes())

    def empty_aligned(self, nbytes: int, alignment: int) -> Any:
        return _aligned_bytes(self.xp, nbytes, alignment, self.address)

    def pinned_empty(self, nbytes: int) -> NDArray[np.uint8]:
        memory = self._cuda.alloc_pinned_memory(nbytes)
        return np.frombuffer(memory, np.uint8, nbytes)  # keeps `memory` alive through the buffer protocol

    def stream(self) -> Any:
        return self._cuda.Stream(non_blocking=True)

    def record(self, stream: Any) -> Any:
        event = self._cuda.Event(block=False, disable_timing=True)
        event.record(stream)
        return _CupyEvent(event)

    def to_host(self, src: Any, dst: NDArray[Any], stream: Any) -> None:
        src.get(stream=stream, out=dst, blocking=False)

    def to_device(self, src: NDArray[Any], dst: Any, stream: Any) -> None:
        dst.set(src, stream=stream)

    def address(self, array: Any) -> int:
        if isinstance(array, np.ndarray):
            return int(array.__array_interface__["data"][0])
        return int(array.data.ptr)

    def capture(self, stream: Any, step: Callable[[], None]) -> Any:
        """Warm up (kernels compiled), then record `step` on `stream`.  Its temporaries come from a stream-ordered
        pool, so the graph owns them: nothing it writes can be memory the default pool hands out later."""
        graph_memory = self.xp.cuda.MemoryAsyncPool()
        with self.xp.cuda.using_allocator(graph_memory.malloc), stream:
            step()
            stream.synchronize()
            stream.begin_capture()
            try:
                step()
            finally:
                graph = stream.end_capture()
        return graph

    def current_stream(self) -> Any:
        """The stream CuPy work runs on now (the model's)."""
        return self._cuda.get_current_stream()

    def wait(self, waiter: Any, on: Any) -> None:
        _cupy_wait(self._cuda, waiter, on)


def _cupy_wait(cuda: Any, waiter: Any, on: Any) -> None:
    """Work queued on `waiter` from now on starts after the work queued on `on` so far."""
    if waiter is on or waiter == on:
        return
    event = cuda.Event(block=False, disable_timing=True)
    event.record(on)
    waiter.wait_event(event)


class _CupyEvent:
    def __init__(self, event: Any) -> None:
        self._event = event

    def done(self) -> bool:
        return bool(self._event.done)

    def synchronize(self) -> None:
        self._event.synchronize()


def numpy_backend() -> NumpyBackend:
    """The CPU stand-in (CI, machines without a GPU)."""
    return NumpyBackend()


def cupy_backend() -> CupyBackend:
    """CuPy on the current device: MissingDependency without CuPy, NoDevice without a usable CUDA device."""
    try:
        cupy = importlib.import_module("cupy")
    except ImportError as err:
        raise MissingDependency(package="cupy", extra="cuda", action="CudaExecutor") from err
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as err:  # CUDARuntimeError, or a driver that cannot load
        raise NoDevice(reason=f"{type(err).__name__}: {err}") from err
    if count < 1:
        raise NoDevice(reason="no CUDA device is visible")
    return CupyBackend(cupy)


def default_backend() -> Backend:
    """CuPy when a CUDA device is usable, else the NumPy stand-in."""
    with contextlib.suppress(MissingDependency, NoDevice):
        return cupy_backend()
    return numpy_backend()
