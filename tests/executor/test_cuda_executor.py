"""CudaExecutor's own contract on the NumPy stand-in: aligned static pools, launched plans and their
completions, refusals that change nothing, views, and host copies through pinned memory or the staging buffer."""

from __future__ import annotations

import numpy as np
import pytest

from hkv_core.errors import (
    HkvError,
    InvalidArgument,
    InvalidExecutorState,
    MissingDependency,
    NoDevice,
    StaleLease,
    UnknownPool,
)
from hkv_core.executor import PoolBinding, TrustingAuthority
from hkv_core.layout import Layout
from hkv_core.plan import Checksum, FillPages, Plan
from hkv_exec_cuda import CudaExecutor, cupy_backend, numpy_backend
from hkv_exec_ref import RefExecutor

FLASH = Layout.from_preset("deepseek_v4_flash")
TAIL = "csa.compressor_tail"  # fp32 entries (2, 1024): a layer's entry is 8 KiB


class Refusing:
    """An authority for which every plan is stale."""

    def verify(self, plan: Plan) -> None:
        raise StaleLease(pool=TAIL, page=1, expected_version=0, found_version=1, request_id=-1)


def bound(authority: object = None, staging_bytes: int = 1 << 20, pages: int = 4) -> CudaExecutor:
    ex = CudaExecutor(numpy_backend(), staging_bytes=staging_bytes)
    ex.bind([PoolBinding(spec=s, pages=pages) for s in FLASH.pools], authority or TrustingAuthority())
    return ex


def fill(ex: CudaExecutor, pool: str) -> None:
    shape = ex.pools[pool].shape
    ex.pools[pool][1:] = np.arange(np.prod(shape[1:]) * (shape[0] - 1)).reshape((shape[0] - 1, *shape[1:]))


def test_pools_are_aligned_and_never_move() -> None:
    ex = bound()
    addresses = ex.addresses()
    for spec in FLASH.pools:
        assert addresses[spec.name] % spec.alignment_bytes == 0
    ex.run(Plan(ops=[FillPages(pool=TAIL, pages=[1, 2], versions=[0, 0], value=3)]))
    assert ex.addresses() == addresses
    with pytest.raises(InvalidExecutorState, match="bind once"):
        ex.bind([PoolBinding(spec=FLASH.pools[0], pages=4)], TrustingAuthority())


def test_a_launched_plan_completes_like_the_reference() -> None:
    ex, ref = bound(), RefExecutor()
    ref.bind([PoolBinding(spec=s, pages=4) for s in FLASH.pools], TrustingAuthority())
    fill(ex, TAIL)
    ref.pools[TAIL][...] = ex.pools[TAIL]
    plan = Plan(ops=[Checksum(pool=TAIL, pages=[1, 3], versions=[0, 0]),
                     FillPages(pool=TAIL, pages=[3], versions=[0], value=7)])
    pending = ex.launch(plan)
    assert pending.done()
    assert pending.wait() == ref.run(plan) == pending.wait()  # waited twice: the same Completion
    assert np.array_equal(ex.pools[TAIL], ref.pools[TAIL])


def test_a_stale_plan_changes_nothing() -> None:
    ex = bound(Refusing())
    before, plans = ex.pools[TAIL].copy(), ex.tally.plans
    with pytest.raises(StaleLease):
        ex.launch(Plan(ops=[FillPages(pool=TAIL, pages=[1], versions=[0], value=9)]))
    assert np.array_equal(ex.pools[TAIL], before) and ex.tally.plans == plans


def test_unknown_pools_and_views() -> None:
    ex = bound()
    for action in (ex.as_array, ex.as_cupy, ex.as_torch, lambda p: ex.read(p, [1]),
                   lambda p: ex.entries(p, [1], 0)):
        with pytest.raises(UnknownPool) as info:
            action("no.such_pool")
        assert TAIL in info.value.known
    with pytest.raises(NoDevice) as no_device:
        ex.as_cupy(TAIL)
    assert isinstance(no_device.value, HkvError) and "numpy" in no_device.value.fields["reason"]
    torch = pytest.importorskip("torch")
    view = ex.as_torch(TAIL)
    assert view.data_ptr() == ex.addresses()[TAIL]
    view[2, 0, 0] = 5.0
    assert np.all(ex.read(TAIL, [2])[0, 0, 0] == 5.0)
    assert ex.as_torch("csa.compressed_kv").dtype == torch.bfloat16


def test_cupy_backend_without_cupy_names_the_extra() -> None:
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(MissingDependency, match=r"hkv\[cuda\]"):
            cupy_backend()
    else:
        pytest.skip("CuPy is installed here")


@pytest.mark.parametrize("staging_bytes", [8 << 10, 20 << 10, 1 << 20],
                         ids=["one-entry-pieces", "column-pieces", "layer-pieces"])
def test_row_copies_through_staging_pieces_and_pinned_memory_agree(staging_bytes: int) -> None:
    ex = bound(staging_bytes=staging_bytes)
    fill(ex, TAIL)
    runs = [(1, 0, 3), (3, 2, 8), (2, 5, 6)]
    layers, entry = ex.pools[TAIL].shape[1], ex.pools[TAIL].shape[3:]
    plain = np.zeros((layers, 10, *entry), np.float32)
    pinned = ex.pinned.empty(plain.shape, np.float32)
    ex.export_rows(TAIL, runs, plain)
    ex.export_rows(TAIL, runs, pinned)
    expected = np.concatenate([ex.pools[TAIL][p, :, a:b] for p, a, b in runs], axis=1)
    assert np.array_equal(plain, expected) and np.array_equal(pinned, expected)
    ex.import_rows(TAIL, [(3, 0, 8), (2, 0, 2)], plain + 1)
    assert np.array_equal(np.concatenate([ex.pools[TAIL][3, :, :8], ex.pools[TAIL][2, :, :2]], axis=1), plain + 1)


def test_an_entry_larger_than_the_staging_buffer_is_refused() -> None:
    ex = bound(staging_bytes=4 << 10)
    with pytest.raises(InvalidArgument, match="staging buffer"):
        ex.export_rows(TAIL, [(1, 0, 1)], np.zeros((ex.pools[TAIL].shape[1], 1, 2, 1024), np.float32))
