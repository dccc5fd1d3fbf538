"""The argument checks every executor makes before it touches a pool (RefExecutor and CudaExecutor share them).

Each raises a typed HkvError that `python -O` does not strip, before anything
is written: `InvalidExecutorState` for a call out of order (before `bind`, a
second `bind`), `UnknownPool` for a pool name the executor does not have,
`InvalidArgument` for a bad slot, page, layer, run, shape or dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hkv_core.errors import InvalidArgument, InvalidExecutorState
from hkv_core.executor import PoolBinding, Run
from hkv_core.units import NULL_PAGE

__all__ = ["bf16_bits", "check_bind", "check_bound", "ids", "layer", "pages", "rows", "runs", "slots", "values"]

Shape = tuple[int, ...]

BIND_FIRST = "no pools are bound yet: call bind(manager.bindings(), manager) first"


def check_bind(action: str, bound: dict[str, Any], pools: Sequence[PoolBinding]) -> None:
    """InvalidExecutorState for a second bind (pools are static); InvalidArgument for pools that are not
    PoolBindings or whose names repeat."""
    if bound:
        raise InvalidExecutorState(action=action, reason=f"pools are static: this executor is already bound to "
                                                         f"{len(bound)} pools ({', '.join(bound)}); bind once")
    if isinstance(pools, str | bytes) or not isinstance(pools, Sequence):
        raise InvalidArgument(action=action, argument="pools", value=pools,
                              reason=f"must be a sequence of PoolBinding (manager.bindings()), got "
                                     f"{type(pools).__name__}")
    names: set[str] = set()
    for binding in pools:
        if not isinstance(binding, PoolBinding):
            raise InvalidArgument(action=action, argument="pools", value=binding,
                                  reason=f"every item must be a PoolBinding, got {type(binding).__name__}")
        if binding.name in names:
            raise InvalidArgument(action=action, argument="pools", value=binding.name,
                                  reason="pool names must be unique")
        names.add(binding.name)


def check_bound(action: str, authority: object) -> None:
    """InvalidExecutorState unless `bind` ran (it set the plans' authority)."""
    if authority is None:
        raise InvalidExecutorState(action=action, reason=BIND_FIRST)


def ids(action: str, pool: str, argument: str, given: ArrayLike) -> NDArray[np.int64]:
    """`given` as a flat int64 array; InvalidArgument unless it holds integers (bools and floats are refused,
    never truncated; an empty list is no ids)."""
    array = np.asarray(given)
    if array.size == 0:
        return np.zeros(0, np.int64)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise InvalidArgument(action=action, argument=argument, value=given,
                              reason=f"{pool}: must be integer ids, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False).ravel()


def slots(action: str, pool: str, given: ArrayLike, shape: Shape, *,
          writing: bool) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """(flat slots, their pages, their offsets) of flat slots `page * entries_per_page + offset` of a pool of
    `shape`; InvalidArgument for a slot past the pool, and when `writing` for one in the NULL page or written
    twice in one call."""
    flat = ids(action, pool, "slots", given)
    per_page = shape[2]
    pages, offsets = flat // per_page, flat % per_page
    lowest = NULL_PAGE + 1 if writing else 0
    bad = (flat < 0) | (pages < lowest) | (pages >= shape[0])
    if bad.any():
        slot = int(flat[np.flatnonzero(bad)[0]])
        where = ("in the NULL page (page 0, never written)" if writing and 0 <= slot < per_page
                 else f"outside slots [{lowest * per_page}, {shape[0] * per_page})")
        raise InvalidArgument(action=action, argument="slots", value=given,
                              reason=f"{pool}: slot {slot} is {where}")
    if writing and np.unique(flat).size != flat.size:
        raise InvalidArgument(action=action, argument="slots", value=given,
                              reason=f"{pool}: a slot is written twice in one call")
    return flat, pages, offsets


def pages(action: str, pool: str, given: ArrayLike, shape: Shape) -> NDArray[np.int64]:
    """Flat page ids of a pool of `shape` (the NULL page included); InvalidArgument for one past the pool."""
    found = ids(action, pool, "pages", given)
    bad = (found < 0) | (found >= shape[0])
    if bad.any():
        raise InvalidArgument(action=action, argument="pages", value=given,
                              reason=f"{pool}: page {int(found[np.flatnonzero(bad)[0]])} is outside [0, {shape[0]})")
    return found


def layer(action: str, pool: str, given: object, shape: Shape) -> int:
    """A layer index of a pool of `shape`; InvalidArgument unless an integer in [0, layers)."""
    if isinstance(given, bool) or not isinstance(given, int | np.integer) or not 0 <= int(given) < shape[1]:
        raise InvalidArgument(action=action, argument="layer", value=given,
                              reason=f"{pool}: must be an integer in [0, {shape[1]})")
    return int(given)


def runs(action: str, pool: str, given: Sequence[Run], shape: Shape, *, writing: bool) -> int:
    """The entries `given` runs `(page, first, stop)` cover; InvalidArgument for a run outside the pool (or,
    when `writing`, in the NULL page) or with first > stop."""
    lowest, total = NULL_PAGE + 1 if writing else 0, 0
    for run in given:
        ok = isinstance(run, tuple | list) and len(run) == 3 and all(
            isinstance(v, int | np.integer) and not isinstance(v, bool) for v in run)
        if not ok or not (lowest <= run[0] < shape[0] and 0 <= run[1] <= run[2] <= shape[2]):
            raise InvalidArgument(action=action, argument="runs", value=run,
                                  reason=f"{pool}: a run is (page, first, stop) with page in [{lowest}, {shape[0]}) "
                                         f"and 0 <= first <= stop <= {shape[2]}")
        total += int(run[2]) - int(run[1])
    return total


def rows(action: str, pool: str, argument: str, array: Any, shape: Shape, n: int, dtype: np.dtype[Any]) -> None:
    """InvalidArgument unless host `array` is (layers, n, *entry_shape) of the pool's storage dtype."""
    want = (shape[1], n, *shape[3:])
    if not isinstance(array, np.ndarray) or array.shape != want or array.dtype != dtype:
        found = (f"{type(array).__name__} {getattr(array, 'dtype', '?')} {tuple(getattr(array, 'shape', ()))}")
        raise InvalidArgument(action=action, argument=argument, value=found,
                              reason=f"{pool}: must be a NumPy array of dtype {dtype}, shape {want}")


def values(action: str, pool: str, given: Any, shape: Shape, n: int, kv_dtype: str,
           storage: np.dtype[Any], xp: Any) -> Any:
    """`given` (n, layers, *entry_shape) as an array of the pool's storage dtype, in `xp`.

    The dtype must be the pool's storage dtype (fp32: float32, fp16: float16, bf16: its raw bits as uint16);
    the one conversion is float32 into a bf16 pool (rounded to nearest even, `bf16_bits`).  Anything else,
    and any other shape, is InvalidArgument: a value is never cast silently (a float stored as integer bits)."""
    array = given if hasattr(given, "dtype") and hasattr(given, "shape") else np.asarray(given)
    want = (n, shape[1], *shape[3:])
    if tuple(array.shape) != want:
        raise InvalidArgument(action=action, argument="values", value=f"shape {tuple(array.shape)}",
                              reason=f"{pool}: must be shaped {want} (one entry of every layer per slot)")
    found = np.dtype(array.dtype)
    if found == storage:
        return array
    if kv_dtype == "bf16" and found == np.float32:
        return bf16_bits(array, xp)
    also = "; float32 values are rounded to bf16" if kv_dtype == "bf16" else ""
    raise InvalidArgument(action=action, argument="values", value=f"dtype {found}",
                          reason=f"{pool}: a {kv_dtype} pool stores {storage} values{also}; convert explicitly")


def bf16_bits(values: Any, xp: Any = None) -> Any:
    """float32 `values` as bf16 bit patterns (uint16), rounded to nearest even; NaN stays a (quiet) NaN.  `xp`:
    the array module to compute in (None: NumPy; CuPy for device values)."""
    xp = np if xp is None else xp
    bits = xp.ascontiguousarray(xp.asarray(values, dtype=xp.float32)).view(xp.uint32)
    rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return xp.where(nan, (bits >> 16) | 0x0040, rounded).astype(xp.uint16)
