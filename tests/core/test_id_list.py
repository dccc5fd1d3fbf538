"""IdList behaves like the list of ids it replaced (keep, clear and an int64 flavour included), and grows
without copying on every append."""

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hkv_core.manager.id_list import IdList

OPS = st.lists(st.one_of(st.tuples(st.just("extend"), st.lists(st.integers(0, 2**31 - 1), max_size=40)),
                         st.tuples(st.just("set"), st.integers(-60, 60), st.integers(0, 100)),
                         st.tuples(st.just("slice"), st.integers(0, 60), st.integers(0, 60)),
                         st.tuples(st.just("keep"), st.lists(st.booleans(), min_size=60, max_size=60)),
                         st.tuples(st.just("clear"))), max_size=30)


@given(OPS, st.sampled_from([np.int32, np.int64]))
def test_matches_a_python_list(ops: list[tuple[Any, ...]], dtype: type[np.signedinteger[Any]]) -> None:
    ids, model = IdList(dtype=dtype), list[int]()
    for op in ops:
        if op[0] == "keep":
            mask = np.resize(np.array(op[1], np.bool_), len(model))  # the 60 flags repeated: lists grow past 60
            ids.keep(mask)
            model = [v for v, kept in zip(model, mask.tolist(), strict=True) if kept]
        elif op[0] == "clear":
            ids.clear()
            model = []
        elif op[0] == "extend":
            ids.extend(op[1])
            model.extend(op[1])
        elif op[0] == "set" and -len(model) <= op[1] < len(model):
            ids[op[1]] = op[2]
            model[op[1]] = op[2]
        elif op[0] == "set":
            with pytest.raises(IndexError):
                ids[op[1]] = op[2]
        else:
            assert ids[op[1]:op[2]].tolist() == model[op[1]:op[2]]
        assert ids == model and len(ids) == len(model) and list(ids) == model and bool(ids) == bool(model)
        assert ids.view().tolist() == model and (not model or ids[-1] == model[-1])
        assert ids.view().dtype == dtype and ids.copy().view().dtype == dtype


def test_copy_is_independent_and_growth_is_amortized() -> None:
    ids = IdList([1, 2, 3])
    twin = ids.copy()
    twin[0] = 9
    assert ids == [1, 2, 3] and twin == [9, 2, 3]
    rooms = set()
    for i in range(10_000):
        ids.append(i)
        rooms.add(len(ids._data))
    assert len(rooms) < 15  # doubling: a handful of reallocations for 10,000 appends
    assert ids[3:6].tolist() == [0, 1, 2] and isinstance(ids[3], int)
    with pytest.raises(IndexError):
        _ = ids[len(ids)]
    assert ids != [1, 2] and ids == IdList(ids.view()) and ids.view().dtype == np.int32


def test_int64_holds_values_beyond_int32() -> None:
    big = [2**40, -(2**35), 2**62]
    versions = IdList(big, np.int64)
    versions.append(2**50)
    assert versions == [*big, 2**50] and versions.view().dtype == np.int64
    twin = versions.copy()
    twin[0] = 1
    assert versions[0] == 2**40 and twin.view().dtype == np.int64
    assert IdList([7]).view().dtype == np.int32


def test_keep_compacts_in_order_and_reuses_the_room() -> None:
    ids = IdList(range(10))
    room = ids._data
    ids.keep(np.arange(10) % 3 == 0)
    assert ids == [0, 3, 6, 9] and ids._data is room and len(ids) == 4
    ids.keep(np.zeros(4, np.bool_))
    assert ids == [] and not ids and ids.view().size == 0
    ids.extend([5, 6])
    assert ids == [5, 6]
    with pytest.raises(IndexError):
        ids.keep(np.ones(3, np.bool_))  # the mask must match the list


def test_clear_empties_without_losing_the_room() -> None:
    ids = IdList(range(100))
    room = ids._data
    ids.clear()
    assert ids == [] and len(ids) == 0 and not ids and list(ids) == []
    with pytest.raises(IndexError):
        _ = ids[0]
    ids.extend(range(3))
    assert ids == [0, 1, 2] and ids._data is room
