"""A strict stand-in: NumPy arrays that refuse to mix with host arrays, as CuPy's device arrays do.

CuPy raises TypeError when a NumPy array meets a device array in an operation,
an index or an assignment (no implicit host <-> device transfer).  The plain
NumPy stand-in cannot catch such a mix-up, since there everything is NumPy.
`strict_backend()` runs the executor and the model on `DeviceArray`s - a NumPy
subclass living in a module that plays CuPy's part (`xp_of` finds it through
`sys.modules["cupy"]`'s `get_array_module` only while `installed()` is active) -
and every operation that mixes in a plain host array raises `HostArrayMixed`.
Transfers go through `asarray` / `.get()` as they would with CuPy.  (One mix-up it
cannot see: `np.asarray(device_array)` of an ndarray subclass never asks the subclass.)
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np

from hkv_exec_cuda.backend import HOST_PAGE_BYTES, NumpyBackend, Stream

__all__ = ["DeviceArray", "HostArrayMixed", "StrictBackend", "installed", "strict_backend"]


class HostArrayMixed(TypeError):
    """A host (NumPy) array was mixed into device work: CuPy would refuse it."""


def _host_arrays(values: Any) -> bool:
    """Does `values` (possibly nested in tuples, lists, dicts) hold a plain NumPy array of at least one dim?"""
    if isinstance(values, DeviceArray):
        return False
    if isinstance(values, np.ndarray):
        return values.ndim > 0
    if isinstance(values, list | tuple):
        return any(_host_arrays(v) for v in values)
    if isinstance(values, dict):
        return any(_host_arrays(v) for v in values.values())
    return False


class DeviceArray(np.ndarray):
    """An array "on the device": operations with host arrays raise HostArrayMixed."""

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if _host_arrays(inputs) or _host_arrays(kwargs.get("out", ())):
            raise HostArrayMixed(f"{ufunc.__name__}: a host array mixed with a device array")
        plain = [np.asarray(x) if isinstance(x, DeviceArray) else x for x in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(np.asarray(o) for o in kwargs["out"])
        result = getattr(ufunc, method)(*plain, **kwargs)
        return _wrap(result)

    def __array_function__(self, func: Any, types_: Any, args: Any, kwargs: Any) -> Any:
        if _host_arrays(args) or _host_arrays(kwargs):
            raise HostArrayMixed(f"{func.__name__}: a host array mixed with a device array")
        return _wrap(func(*_unwrap(args), **_unwrap(kwargs)))

    def __getitem__(self, index: Any) -> Any:
        if _host_arrays(index):
            raise HostArrayMixed("indexing a device array with a host array")
        return _wrap(np.asarray(self)[_unwrap(index)])

    def __setitem__(self, index: Any, value: Any) -> None:
        if _host_arrays(index) or _host_arrays(value):
            raise HostArrayMixed("assigning into a device array with a host index or host values")
        np.asarray(self)[_unwrap(index)] = _unwrap(value)

    def get(self) -> np.ndarray:
        """A host copy (CuPy's `ndarray.get`)."""
        return np.array(self.view(np.ndarray))

    def tolist(self) -> Any:
        return self.view(np.ndarray).tolist()


def _unwrap(values: Any) -> Any:
    if isinstance(values, DeviceArray):
        return values.view(np.ndarray)
    if isinstance(values, tuple):
        return tuple(_unwrap(v) for v in values)
    if isinstance(values, list):
        return [_unwrap(v) for v in values]
    if isinstance(values, dict):
        return {k: _unwrap(v) for k, v in values.items()}
    return values


def _wrap(result: Any) -> Any:
    if isinstance(result, np.ndarray) and not isinstance(result, DeviceArray):
        return result.view(DeviceArray)
    if isinstance(result, tuple):
        return tuple(_wrap(r) for r in result)
    return result


def _device_module() -> types.ModuleType:
    """A module with NumPy's names whose array-returning functions return DeviceArrays ("cupy")."""
    module = types.ModuleType("hkv_strict_device")

    def asarray(a: Any, dtype: Any = None) -> DeviceArray:
        return np.array(_unwrap(a), dtype=dtype, copy=None).view(DeviceArray)

    def lookup(name: str) -> Any:
        value = getattr(np, name)
        if not callable(value) or isinstance(value, type):
            return value

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if _host_arrays(args) or _host_arrays(kwargs):
                raise HostArrayMixed(f"{name}: a host array passed to the device module")
            return _wrap(value(*_unwrap(args), **_unwrap(kwargs)))
        return wrapped

    module.__getattr__ = lookup  # type: ignore[method-assign]
    module.asarray = asarray  # type: ignore[attr-defined]
    module.asnumpy = lambda a: np.array(_unwrap(a))  # type: ignore[attr-defined]
    return module


DEVICE = _device_module()


class StrictBackend(NumpyBackend):
    """NumpyBackend whose device arrays are DeviceArrays of the strict module; transfers convert explicitly."""

    name = "strict"
    xp: Any = DEVICE

    def empty_aligned(self, nbytes: int, alignment: int) -> Any:
        return super().empty_aligned(nbytes, alignment).view(DeviceArray)

    def pinned_empty(self, nbytes: int) -> np.ndarray:
        return NumpyBackend.empty_aligned(self, nbytes, HOST_PAGE_BYTES)  # host memory: a plain NumPy array

    def to_host(self, src: Any, dst: np.ndarray, stream: Stream) -> None:
        np.copyto(dst, src.view(np.ndarray))

    def to_device(self, src: np.ndarray, dst: Any, stream: Stream) -> None:
        np.copyto(dst.view(np.ndarray), src)


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Make `xp_of` see DeviceArrays as "cupy" arrays for the block (a fake `sys.modules['cupy']`)."""
    fake = types.ModuleType("cupy")
    fake.get_array_module = lambda *arrays: (  # type: ignore[attr-defined]
        DEVICE if any(isinstance(a, DeviceArray) for a in arrays) else np)
    saved = sys.modules.get("cupy")
    sys.modules["cupy"] = fake
    try:
        yield
    finally:
        if saved is None:
            del sys.modules["cupy"]
        else:
            sys.modules["cupy"] = saved


def strict_backend() -> StrictBackend:
    """The strict stand-in (use inside `installed()` so the model sees its arrays as device arrays)."""
    return StrictBackend()
