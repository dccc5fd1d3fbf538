"""Zero-copy views of the RefExecutor's pools: `as_numpy` (the pool's own array) and `as_torch` (torch optional)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from hkv_core.errors import HkvError, MissingDependency, UnknownPool
from hkv_core.executor import PoolBinding, TrustingAuthority
from hkv_core.layout import Layout
from hkv_exec_ref import RefExecutor

LAYOUT = Layout.from_preset("tiny_v4")
FLASH = Layout.from_preset("deepseek_v4_flash")


def bound(layout: Layout = LAYOUT, pages: int = 4) -> RefExecutor:
    ex = RefExecutor()
    ex.bind([PoolBinding(spec=s, pages=pages) for s in layout.pools], TrustingAuthority())
    return ex


def test_as_numpy_is_the_pool_itself_and_writes_are_seen_by_read() -> None:
    ex = bound()
    for spec in LAYOUT.pools:
        view = ex.as_numpy(spec.name)
        assert view is ex.pools[spec.name]  # no copy
        assert view.flags.writeable
        assert view.shape == PoolBinding(spec=spec, pages=4).shape
        last = view.shape[2] - 1
        view[2, :, last] = 7  # an engine's kernel writing the last entry of page 2, every layer
        page = ex.read(spec.name, [2])[0]
        assert np.all(page[:, last] == 7)
        assert not np.any(page[:, :last]) and not np.any(ex.read(spec.name, [1]))


def test_as_numpy_unknown_pool_names_the_known_pools() -> None:
    ex = bound()
    with pytest.raises(UnknownPool) as info:
        ex.as_numpy("csa.no_such_pool")
    assert isinstance(info.value, HkvError)
    assert info.value.fields["pool"] == "csa.no_such_pool"
    assert info.value.known == tuple(s.name for s in LAYOUT.pools)
    for spec in LAYOUT.pools:
        assert spec.name in str(info.value)
    with pytest.raises(UnknownPool, match=r"none bound"):
        RefExecutor().as_numpy("csa.swa_window")


@pytest.mark.parametrize("pool", [[], {}, ["csa.swa_window"], None, 3], ids=repr)
@pytest.mark.parametrize("method", ["as_numpy", "as_torch"])
def test_a_pool_name_that_is_not_a_string_is_an_unknown_pool(method: str, pool: object) -> None:
    ex = bound()
    with pytest.raises(UnknownPool) as info:  # not TypeError ("unhashable type") from the dict lookup
        getattr(ex, method)(pool)
    assert info.value.pool is pool and info.value.action == method
    assert info.value.known == tuple(s.name for s in LAYOUT.pools)


def test_as_torch_without_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = bound()
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError, installed or not
    with pytest.raises(MissingDependency, match=r"pip install 'hkv\[torch\]'") as info:
        ex.as_torch(LAYOUT.pools[0].name)
    assert isinstance(info.value, ImportError) and isinstance(info.value, HkvError)
    assert info.value.fields == {"package": "torch", "extra": "torch", "action": "as_torch"}
    with pytest.raises(UnknownPool):  # the pool is checked first, torch or not
        ex.as_torch("nope")


def test_as_torch_shares_memory_with_the_pool() -> None:
    torch = pytest.importorskip("torch", reason="torch is optional (pip install 'hkv[torch]'); the view needs it")
    for layout in (LAYOUT, FLASH):
        ex = bound(layout, pages=3)
        for spec in layout.pools:
            tensor = ex.as_torch(spec.name)
            assert tuple(tensor.shape) == ex.as_numpy(spec.name).shape
            assert tensor.dtype == {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[spec.dtype]
            tensor[1, :, -1] = 1.0  # 1.0 is exact in every float format
            page = ex.read(spec.name, [1])[0]
            assert np.all(page[:, -1] != 0) and not np.any(page[:, :-1]) and not np.any(ex.read(spec.name, [2]))
            assert tensor.data_ptr() == ex.addresses()[spec.name]
