"""IdList: a growable int32 array of page or block ids with the list operations the manager uses.

A request's chain and page tables grow by a block at a time while decoding;
as Python lists every step converted the whole list to an array (O(context)
per decoded token).  IdList keeps the ids in NumPy with doubling room:
`view()` is free, `extend` is amortized O(new), and iteration, `len`,
integer indexing and equality with a list behave like a list of ints.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

Ids = NDArray[Any]  # int32 ids (or int64 versions)
MIN_ROOM = 16
EMPTY_VALUES: tuple[int, ...] = ()
# Shared zero-length rooms of empty lists: no element of them can ever be written (extend reallocates first).
NO_ROOM = {np.dtype(t): np.empty(0, t) for t in (np.int32, np.int64)}
NO_ROOM_OF: dict[type, NDArray[Any]] = {t: NO_ROOM[np.dtype(t)] for t in (np.int32, np.int64)}  # by scalar type


def appended(view: NDArray[Any], room: NDArray[Any] | None,
             more: NDArray[Any]) -> tuple[NDArray[Any], NDArray[Any]]:
    """`view` + `more` as a prefix view of `room` (reallocated, doubling, only when full).

    `view` must be `room[:len(view)]` (or any array when `room` is None).
    """
    n, m = len(view), len(more)
    if room is None or n + m > len(room):
        room = np.empty((max(MIN_ROOM, 2 * (n + m)), *view.shape[1:]), view.dtype)
        room[:n] = view
    room[n:n + m] = more
    return room[:n + m], room


def _flat(values: ArrayLike, dtype: Any) -> NDArray[Any]:
    """`values` as a 1-D array: a 1-D array as it is (assigning it into the list casts), else converted."""
    if type(values) is np.ndarray and values.ndim == 1:
        return values
    return np.asarray(values, dtype).ravel()


class IdList:
    """Ids 0 .. len-1 live in `self._data[:len]`; slices and `view()` are views (copy before keeping them).

    int32 by default (block, object and page ids); `dtype=np.int64` for versions.
    """

    __slots__ = ("_data", "_len")

    def __init__(self, values: ArrayLike = EMPTY_VALUES, dtype: type[np.signedinteger[Any]] = np.int32) -> None:
        self._data: Ids
        if values is EMPTY_VALUES:  # the common case (a request's new tables): no array until the first extend
            room = NO_ROOM_OF.get(dtype)
            self._data, self._len = (NO_ROOM[np.dtype(dtype)] if room is None else room), 0
            return
        ids = _flat(values, dtype)
        self._data = np.empty(max(MIN_ROOM, 2 * len(ids)), dtype)
        self._data[:len(ids)] = ids
        self._len = len(ids)

    def view(self) -> Ids:
        return self._data[:self._len]

    def extend(self, values: ArrayLike) -> None:
        view, self._data = appended(self.view(), self._data, _flat(values, self._data.dtype))
        self._len = len(view)

    def append(self, value: int) -> None:
        self.extend((value,))

    def keep(self, mask: NDArray[np.bool_]) -> None:
        """Keep only the ids where `mask` is True (same length as the list), in order."""
        kept = self.view()[mask]
        self._data[:len(kept)] = kept
        self._len = len(kept)

    def clear(self) -> None:
        self._len = 0

    def truncate(self, length: int) -> None:
        """Keep the first `length` ids."""
        assert 0 <= length <= self._len, (length, self._len)
        self._len = length

    def copy(self) -> IdList:
        return IdList(self.view(), self._data.dtype.type)

    def tolist(self) -> list[int]:
        return list(self.view().tolist())

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[int]:
        return iter(self.tolist())

    @overload
    def __getitem__(self, key: int) -> int: ...

    @overload
    def __getitem__(self, key: slice) -> Ids: ...

    def __getitem__(self, key: int | slice) -> int | Ids:
        if isinstance(key, slice):
            return self.view()[key]
        if not -self._len <= key < self._len:
            raise IndexError(f"index {key} out of range for {self._len} ids")
        return int(self._data[key % self._len])

    def __setitem__(self, key: int | slice, value: ArrayLike) -> None:
        if isinstance(key, int) and not -self._len <= key < self._len:
            raise IndexError(f"index {key} out of range for {self._len} ids")
        self.view()[key] = value

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IdList):
            return bool(np.array_equal(self.view(), other.view()))
        if isinstance(other, list | tuple):
            return self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"IdList({self.tolist()})"
