"""Both executors' argument checks: typed HkvErrors (never `assert`, so `python -O` keeps them), raised before
anything is written; a write whose dtype is not the pool's is refused, except float32 into a bf16 pool, which
is rounded to bf16 (never stored as integer bits)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from hkv_core.errors import HkvError, InvalidArgument, InvalidExecutorState, UnknownPool
from hkv_core.executor import PoolBinding, TrustingAuthority
from hkv_core.layout import Layout
from hkv_core.plan import CopyPages, FillPages, Plan
from hkv_exec_cuda import CudaExecutor, numpy_backend
from hkv_exec_ref import RefExecutor
from hkv_exec_ref.executor import bf16_bits

FLASH = Layout.from_preset("deepseek_v4_flash")
BF16, FP32 = "swa.swa_window", "csa.compressor_tail"  # V4-Flash: the SWA rows are bf16, the tails fp32
PAGES = 4

MAKERS: dict[str, Callable[[], Any]] = {"ref": RefExecutor, "cuda": lambda: CudaExecutor(numpy_backend())}


def bindings() -> list[PoolBinding]:
    return [PoolBinding(spec=s, pages=PAGES) for s in FLASH.pools if s.name in (BF16, FP32)]


def bound(kind: str) -> Any:
    ex = MAKERS[kind]()
    ex.bind(bindings(), TrustingAuthority())
    return ex


def entry(ex: Any, pool: str, n: int = 1) -> tuple[int, ...]:
    shape = ex.pools[pool].shape
    return (n, shape[1], *shape[3:])


def snapshot(ex: Any) -> dict[str, np.ndarray]:
    return {name: np.array(array, copy=True) for name, array in ex.pools.items()}


def unchanged(ex: Any, before: dict[str, np.ndarray]) -> bool:
    return all(np.array_equal(np.asarray(ex.pools[n]), before[n]) for n in before)


def test_bf16_bits_round_to_nearest_even() -> None:
    words = np.array([0x3F800000, 0xC0000000, 0x3F808000, 0x3F818000, 0x3F808001, 0x7F800000, 0x7FC00001],
                     np.uint32)
    assert bf16_bits(words.view(np.float32)).tolist() == [0x3F80, 0xC000, 0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x7FC0]
    assert bf16_bits(np.float32([np.nan])).view(np.uint16)[0] & 0x7FC0 == 0x7FC0  # NaN stays NaN


@pytest.mark.parametrize("kind", MAKERS)
def test_a_float32_write_into_a_bf16_pool_stores_bf16_bits_not_integers(kind: str) -> None:
    ex = bound(kind)
    per_page = ex.pools[BF16].shape[2]
    ex.write(BF16, [per_page + 3], np.full(entry(ex, BF16), 1.0, np.float32))
    stored = np.asarray(ex.read(BF16, [1]))[0, :, 3]
    assert stored.dtype == np.uint16 and np.all(stored == 0x3F80), hex(int(stored.ravel()[0]))  # not 0x0001
    raw = np.full(entry(ex, BF16), 0x4049, np.uint16)  # raw bits are the storage dtype: written as they are
    ex.write(BF16, [per_page + 4], raw)
    assert np.all(np.asarray(ex.read(BF16, [1]))[0, :, 4] == 0x4049)


@pytest.mark.parametrize("kind", MAKERS)
@pytest.mark.parametrize("pool, dtype", [(BF16, np.float64), (BF16, np.int64), (BF16, np.float16),
                                         (FP32, np.float64), (FP32, np.float16), (FP32, np.uint16),
                                         (FP32, np.int32)], ids=str)
def test_a_write_of_another_dtype_is_a_typed_error_and_writes_nothing(kind: str, pool: str, dtype: type) -> None:
    ex = bound(kind)
    before = snapshot(ex)
    with pytest.raises(InvalidArgument) as info:
        ex.write(pool, [ex.pools[pool].shape[2]], np.ones(entry(ex, pool), dtype))
    assert info.value.argument == "values" and np.dtype(dtype).name in str(info.value)
    assert unchanged(ex, before) and ex.tally.entries_written == 0


@pytest.mark.parametrize("kind", MAKERS)
def test_bad_slots_pages_layers_and_shapes_are_typed_errors_that_change_nothing(kind: str) -> None:
    ex = bound(kind)
    per_page = ex.pools[FP32].shape[2]
    one = np.zeros(entry(ex, FP32), np.float32)
    layers = ex.pools[FP32].shape[1]
    before = snapshot(ex)
    calls: list[tuple[str, Callable[[], object]]] = [
        ("slots", lambda: ex.write(FP32, [0], one)),  # the NULL page: never written
        ("slots", lambda: ex.write(FP32, [per_page - 1], one)),
        ("slots", lambda: ex.write(FP32, [PAGES * per_page], one)),
        ("slots", lambda: ex.write(FP32, [-1], one)),
        ("slots", lambda: ex.write(FP32, [per_page, per_page], np.zeros(entry(ex, FP32, 2), np.float32))),
        ("slots", lambda: ex.write(FP32, [float(per_page)], one)),
        ("slots", lambda: ex.write(FP32, [True], one)),
        ("values", lambda: ex.write(FP32, [per_page], np.zeros(entry(ex, FP32, 2), np.float32))),
        ("slots", lambda: ex.entries(FP32, [PAGES * per_page], 0)),
        ("layer", lambda: ex.entries(FP32, [per_page], ex.pools[FP32].shape[1])),
        ("layer", lambda: ex.entries(FP32, [per_page], -1)),
        ("pages", lambda: ex.read(FP32, [PAGES])),
        ("pages", lambda: ex.read(FP32, [1.5])),
        ("runs", lambda: ex.import_rows(FP32, [(0, 0, 1)], np.zeros((layers, 1, 2, 1024), np.float32))),
        ("runs", lambda: ex.export_rows(FP32, [(1, 2, 1)], np.zeros((layers, 0, 2, 1024), np.float32))),
        ("src", lambda: ex.import_rows(FP32, [(1, 0, 2)], np.zeros((layers, 1, 2, 1024), np.float32))),
        ("src", lambda: ex.import_rows(FP32, [(1, 0, 1)], np.zeros((layers, 1, 2, 1024), np.float64))),
        ("plan", lambda: ex.run(Plan(ops=[CopyPages(pool=FP32, src=1, dst=0, entries=1, src_version=0)]))),
        ("plan", lambda: ex.run(Plan(ops=[FillPages(pool=FP32, pages=[PAGES], versions=[0])]))),
    ]
    for argument, call in calls:
        with pytest.raises(InvalidArgument) as info:
            call()
        assert info.value.argument == argument, (argument, info.value)
        assert unchanged(ex, before), argument
    with pytest.raises(UnknownPool):
        ex.run(Plan(ops=[FillPages(pool="no.such_pool", pages=[1], versions=[0])]))


@pytest.mark.parametrize("kind", MAKERS)
def test_calls_before_bind_and_a_second_bind_are_typed_errors(kind: str) -> None:
    fresh = MAKERS[kind]()
    with pytest.raises(UnknownPool, match="none bound"):
        fresh.write(FP32, [16], np.zeros((1, 2, 2, 1024), np.float32))  # no KeyError
    with pytest.raises(InvalidExecutorState, match="bind"):
        fresh.run(Plan(ops=[]))
    ex = bound(kind)
    addresses = ex.addresses()
    with pytest.raises(InvalidExecutorState, match="bind once") as info:
        ex.bind(bindings(), TrustingAuthority())
    assert isinstance(info.value, HkvError) and ex.addresses() == addresses
    twice = [bindings()[0], bindings()[0]]
    with pytest.raises(InvalidArgument, match="unique"):
        MAKERS[kind]().bind(twice, TrustingAuthority())


SCRIPT = """
import numpy as np
from hkv_core.executor import PoolBinding, TrustingAuthority
from hkv_core.layout import Layout
from hkv_exec_cuda import CudaExecutor, numpy_backend
from hkv_exec_ref import RefExecutor
spec = Layout.from_preset("tiny_v4").pools[0]
for ex in (RefExecutor(), CudaExecutor(numpy_backend())):
    ex.bind([PoolBinding(spec=spec, pages=3)], TrustingAuthority())
    shape = ex.pools[spec.name].shape
    try:
        ex.write(spec.name, [0], np.ones((1, shape[1], *shape[3:]), np.float32))
        print("accepted", bool(np.asarray(ex.pools[spec.name])[0].any()))
    except Exception as err:
        print(type(err).__name__)
"""


def test_the_checks_hold_under_python_O() -> None:
    """`python -O` strips asserts: a write into the NULL page is still refused, by both executors."""
    done = subprocess.run([sys.executable, "-O", "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["InvalidArgument", "InvalidArgument"], done.stdout
