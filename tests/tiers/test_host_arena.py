"""The host tier's fixed arena: records in and out, budget refusals that change nothing, no fragmentation leak."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hkv_core.errors import TierError, TierFull
from hkv_tiers import HostArena


def test_put_view_get_drop() -> None:
    store = HostArena(3 * 4096)
    store.put("a", b"x" * 5000)
    store.put("b", np.arange(100, dtype=np.float32))
    assert store.get("a") == b"x" * 5000 and store.used_bytes == 3 * 4096
    assert np.array_equal(store.view("b").view(np.float32), np.arange(100, dtype=np.float32))
    with pytest.raises(ValueError):
        store.view("b")[0] = 1  # read-only: the tier's bytes change only through put
    with pytest.raises(TierFull) as info:
        store.put("c", b"y")
    assert info.value.free == 0 and "c" not in store.records
    store.drop("a")
    store.put("c", b"y" * 8192)
    assert store.get("c") == b"y" * 8192
    with pytest.raises(TierError, match="no such record"):
        store.get("a")


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(0, 3), st.integers(1, 9000)), max_size=40))
def test_any_sequence_keeps_records_intact_and_frees_everything(ops: list[tuple[str, int, int]]) -> None:
    store, model = HostArena(8 * 4096), {}
    for name, kind, size in ops:
        if kind == 0 and name in model:
            store.drop(name)
            del model[name]
            continue
        data = bytes([size % 251]) * size
        try:
            store.put(name, data)
            model[name] = data
        except TierFull:
            pass  # refused: nothing changed
        assert {n: store.get(n) for n in model} == model
        extents = sorted([(s, -(-n // 4096) * 4096) for s, n in store.records.values()] + store.free)
        assert sum(length for _, length in extents) == store.budget  # records and free extents tile the arena
        assert store.used_bytes == sum(-(-n // 4096) * 4096 for _, n in store.records.values())  # kept as it goes
        assert all(a + la == b for (a, la), (b, _) in zip(extents, extents[1:], strict=False))
    for name in list(model):
        store.drop(name)
    assert store.free == [(0, store.budget)] and store.used_bytes == 0
