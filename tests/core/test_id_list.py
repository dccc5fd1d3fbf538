"""IdList behaves like the list of ids it replaced, and grows without copying on every append."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hkv_core.manager.id_list import IdList

OPS = st.lists(st.one_of(st.tuples(st.just("extend"), st.lists(st.integers(0, 2**31 - 1), max_size=40)),
                         st.tuples(st.just("set"), st.integers(-60, 60), st.integers(0, 100)),
                         st.tuples(st.just("slice"), st.integers(0, 60), st.integers(0, 60))), max_size=30)


@given(OPS)
def test_matches_a_python_list(ops: list[tuple]) -> None:
    ids, model = IdList(), []
    for op in ops:
        if op[0] == "extend":
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
