"""Executors over buffers the engine owns: `bind(..., buffers={pool: tensor})` adopts CPU torch tensors (and NumPy
arrays) through DLPack without a copy, on the reference and on the CUDA executor's stand-in; the engine serves
exactly with every pool in its own tensors; a buffer of the wrong shape, dtype, layout, alignment or memory is a
BufferMismatch naming the pool and the check, before anything is bound (docs/executor.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from hkv_core.errors import BufferMismatch, InvalidArgument, PoolsTooLarge, UnknownPool
from hkv_core.executor import PlanAuthority, PoolBinding, TrustingAuthority, device_estimate
from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig, estimate_device_bytes
from hkv_exec_cuda import CudaExecutor, numpy_backend
from hkv_exec_ref import Engine, RefExecutor
from hkv_exec_ref.engine.engine import TINY_DEFAULTS

torch = pytest.importorskip("torch")

TINY = Layout.from_preset("tiny_v4")
MAKERS: dict[str, Callable[[], Any]] = {"ref": RefExecutor, "stand-in": lambda: CudaExecutor(numpy_backend())}
WINDOW = "csa.swa_window"


def aligned(shape: tuple[int, ...], dtype: Any, alignment: int, *, offset: int = 0) -> Any:
    """A CPU tensor of `shape` whose data starts `offset` bytes past a multiple of `alignment`."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = int(np.prod(shape)) * itemsize
    raw = torch.zeros(nbytes + 2 * alignment, dtype=torch.uint8)
    skip = -raw.data_ptr() % alignment + offset
    return raw[skip:skip + nbytes].view(dtype).reshape(shape)


def tensors_for(bindings: Sequence[PoolBinding]) -> dict[str, Any]:
    """What an engine allocates for itself: one tensor per pool, bf16 pools as their int16 bits."""
    out = {}
    for b in bindings:
        dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.int16}[b.spec.dtype]
        out[b.name] = aligned(b.shape, dtype, b.spec.alignment_bytes)
    return out


class Adopting(RefExecutor):
    """A RefExecutor that binds over the engine's tensors (Engine binds its executor itself)."""

    def __init__(self, buffers: Mapping[str, Any]) -> None:
        super().__init__()
        self.engine_buffers = buffers

    def bind(self, pools: Sequence[PoolBinding], authority: PlanAuthority, *, max_bytes: int | None = None,
             buffers: Mapping[str, Any] | None = None) -> dict[str, int]:
        return super().bind(pools, authority, max_bytes=max_bytes, buffers=self.engine_buffers)


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_adopted_tensors_are_the_pools_without_a_copy(make: Callable[[], Any]) -> None:
    m = CacheManager(TINY, ManagerConfig(default_pool_pages=8))
    window = aligned(next(b for b in m.bindings() if b.name == WINDOW).shape, torch.float32, 64)
    window.fill_(5.0)
    ex = make()
    addresses = ex.bind(m.bindings(), m, buffers={WINDOW: window})
    assert addresses[WINDOW] == window.data_ptr() and float(window.abs().sum()) == 0.0  # zeroed like the others
    ex.write(WINDOW, [9], np.ones((1, 1, 16), np.float32))  # page 1, row 1: the executor writes the tensor
    assert torch.equal(window[1, 0, 1], torch.ones(16)) and float(window.sum()) == 16.0
    window[2, 0, 3] = 7.0  # the engine's kernels write the pool
    assert np.array_equal(ex.read(WINDOW, [2])[0, 0, 3], np.full(16, 7.0, np.float32))
    assert set(ex.pools) == {b.name for b in m.bindings()}  # the other pools the executor allocated


def test_the_engine_serves_exactly_with_every_pool_in_its_own_tensors() -> None:
    config = ManagerConfig(**{**TINY_DEFAULTS, "default_pool_pages": 48})
    estimate = estimate_device_bytes(TINY, config)
    shapes = [PoolBinding(spec=s, pages=estimate.pages[s.name]) for s in TINY.pools]
    buffers = tensors_for(shapes)
    engine = Engine.tiny(0, executor=Adopting(buffers), default_pool_pages=48)
    prompt = np.arange(3, 60) % 50
    first = engine.generate(prompt, 4, chunk_tokens=9)
    second = engine.generate(np.concatenate([prompt[:40], np.arange(7, 20)]), 4)
    assert second.cached_tokens > 0
    assert engine.matches_recompute(prompt, first)
    assert engine.addresses == {name: t.data_ptr() for name, t in buffers.items()}
    assert all(float(t.abs().sum()) > 0 for t in buffers.values())  # the KV lives in the engine's tensors


def test_a_bf16_pool_takes_its_bits_as_int16() -> None:
    flash = Layout.from_preset("deepseek_v4_flash", block_tokens=16)
    spec = next(s for s in flash.pools if s.name == "swa.swa_window")
    binding = PoolBinding(spec=spec, pages=3)
    bf16 = aligned(binding.shape, torch.bfloat16, spec.alignment_bytes)
    ex = RefExecutor()
    with pytest.raises(BufferMismatch) as info:
        ex.bind([binding], TrustingAuthority(), buffers={spec.name: bf16})
    assert info.value.check == "dlpack" and "tensor.view(torch.int16)" in str(info.value) and ex.pools == {}
    ex.bind([binding], TrustingAuthority(), buffers={spec.name: bf16.view(torch.int16)})
    ex.write(spec.name, [16], np.full((1, 2, 512), 0x3F80, np.uint16))  # bf16 1.0
    assert torch.equal(bf16[1, :, 0], torch.ones(2, 512, dtype=torch.bfloat16))


def bad_buffers(bindings: dict[str, PoolBinding]) -> list[tuple[str, dict[str, Any], str]]:
    shape = bindings[WINDOW].shape
    other = bindings["hca.swa_window"]
    shared = aligned((2, *shape), torch.float32, 64)
    return [
        ("shape", {WINDOW: aligned((shape[0] + 1, *shape[1:]), torch.float32, 64)}, WINDOW),
        ("dtype", {WINDOW: aligned(shape, torch.float64, 64)}, WINDOW),
        ("contiguous", {WINDOW: aligned(shape[::-1], torch.float32, 64).permute(3, 2, 1, 0)}, WINDOW),
        ("alignment", {WINDOW: aligned(shape, torch.float32, 64, offset=4)}, WINDOW),
        ("overlap", {WINDOW: shared[0], other.name: shared[0].view(other.shape)}, other.name),
        ("dlpack", {WINDOW: [[0.0]]}, WINDOW),
    ]


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_a_buffer_that_cannot_be_the_pool_is_refused_before_anything_is_bound(make: Callable[[], Any]) -> None:
    m = CacheManager(TINY, ManagerConfig(default_pool_pages=8))
    bindings = {b.name: b for b in m.bindings()}
    ex = make()
    for check, buffers, pool in bad_buffers(bindings):
        marks = {name: (t.clone() if hasattr(t, "clone") else t) for name, t in buffers.items()}
        for t in buffers.values():
            if hasattr(t, "fill_"):
                t.fill_(3)
        with pytest.raises(BufferMismatch) as info:
            ex.bind(m.bindings(), m, buffers=buffers)
        err = info.value
        assert (err.check, err.pool) == (check, pool), err
        assert err.fields["check"] == check and pool in str(err)
        assert ex.pools == {} and ex.bindings == {}, check
        assert all(float(t.sum()) == 3 * t.numel() for t in buffers.values() if hasattr(t, "sum")), check
        assert marks.keys() == buffers.keys()
    readonly = np.zeros(bindings[WINDOW].shape, np.float32)
    readonly.flags.writeable = False
    with pytest.raises(BufferMismatch) as ro:
        ex.bind(m.bindings(), m, buffers={WINDOW: readonly})
    assert ro.value.check in ("dlpack", "writable")
    with pytest.raises(UnknownPool):
        ex.bind(m.bindings(), m, buffers={"nope": readonly})
    with pytest.raises(InvalidArgument):
        ex.bind(m.bindings(), m, buffers=[readonly])
    assert ex.pools == {}
    good = aligned(tuple(bindings[WINDOW].shape), torch.float32, bindings[WINDOW].spec.alignment_bytes)
    assert ex.bind(m.bindings(), m, buffers={WINDOW: good})  # binds now (an aligned buffer: NumPy's may not be)


def test_adopted_pools_need_no_memory_of_the_executors() -> None:
    m = CacheManager(TINY, ManagerConfig(default_pool_pages=8))
    bindings = list(m.bindings())
    buffers = tensors_for(bindings[:3])
    rest = device_estimate(bindings[3:]).total
    with pytest.raises(PoolsTooLarge):
        RefExecutor().bind(bindings, m, max_bytes=rest - 1, buffers=buffers)
    assert RefExecutor().bind(bindings, m, max_bytes=rest, buffers=buffers)
