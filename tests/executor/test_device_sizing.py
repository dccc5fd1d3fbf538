"""Device memory sizing: `estimate_device_bytes` (the executor's side of `estimate_metadata`) equals what a bind
allocates, and both executors refuse pools that cannot fit with PoolsTooLarge before allocating any (the README's
old `default_pool_pages=20_000` on V4-Flash at block 16 meant about 263 GB); the sizing example of
docs/executor.md fits an 80 GB GPU."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from hkv_core.errors import ConfigError, InvalidArgument, PoolsTooLarge
from hkv_core.executor import PoolBinding, TrustingAuthority, available_host_bytes, device_estimate
from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig, estimate_device_bytes
from hkv_exec_cuda import CudaExecutor, numpy_backend
from hkv_exec_cuda.backend import NumpyBackend
from hkv_exec_ref import RefExecutor

ROOT = Path(__file__).resolve().parents[2]
FLASH = Layout.from_preset("deepseek_v4_flash", block_tokens=16)
TINY = Layout.from_preset("tiny_v4")
OLD_README = ManagerConfig(default_pool_pages=20_000, retain_every_blocks=16)
# docs/executor.md's example for V4-Flash at block 16 (and the README's): about 37 GB of pools
SIZED = ManagerConfig(max_requests=64, retain_every_blocks=16, pool_pages={
    "csa.compressed_kv": 120_000, "csa.indexer_state.keys": 30_000, "hca.compressed_kv": 4_000,
    "swa.swa_window": 12_000, "csa.swa_window": 12_000, "hca.swa_window": 12_000,
    "csa.compressor_tail": 1_280, "csa.indexer_state.tail": 1_280, "hca.compressor_tail": 1_280})


class SmallDevice(NumpyBackend):
    """The stand-in with a device that says it has `free` bytes free."""

    def __init__(self, free: int) -> None:
        self.free = free

    memory_name = "free device memory (test)"

    def free_bytes(self) -> int | None:
        return self.free


def test_the_estimate_is_what_bind_allocates() -> None:
    config = ManagerConfig(default_pool_pages=24, pool_pages={"csa.compressor_tail": 5})
    m = CacheManager(TINY, config)
    estimate = estimate_device_bytes(TINY, config)
    assert estimate == device_estimate(m.bindings(), roles=estimate.roles)
    ex = RefExecutor()
    ex.bind(m.bindings(), m)
    assert dict(estimate.pools) == {name: array.nbytes for name, array in ex.pools.items()}
    assert estimate.pages["csa.compressor_tail"] == 6 and estimate.total == sum(a.nbytes for a in ex.pools.values())
    roles = estimate.by_role()
    assert set(roles) == {"prefix", "window", "tail"} and sum(roles.values()) == estimate.total
    padded = estimate_device_bytes(TINY, config, padding=True)
    assert padded.total == estimate.total + sum(p.alignment_bytes for p in TINY.pools)


def test_the_old_readme_config_needs_263_gb_mostly_tails() -> None:
    estimate = estimate_device_bytes(FLASH, OLD_README)
    assert estimate.total == 263_304_044_544
    assert estimate.largest[0] == ("hca.compressor_tail", 209_725_685_760)
    assert estimate.by_role()["tail"] > 0.9 * estimate.total
    with pytest.raises(ConfigError, match="no pool 'nope'"):
        estimate_device_bytes(FLASH, ManagerConfig(pool_pages={"nope": 4}))


@pytest.mark.parametrize("make", [RefExecutor, lambda: CudaExecutor(numpy_backend())], ids=["ref", "stand-in"])
def test_a_bind_that_cannot_fit_is_refused_before_allocating(make: object) -> None:
    m = CacheManager(FLASH, OLD_README)
    ex = make()  # type: ignore[operator]
    tracemalloc.start()
    try:
        with pytest.raises(PoolsTooLarge) as info:
            ex.bind(m.bindings(), m)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    err = info.value
    assert peak < 1 << 20, f"{peak} bytes allocated before refusing"
    assert ex.pools == {} and ex.bindings == {}
    assert isinstance(err, ConfigError) and err.key == "pool_pages"
    assert err.needed_bytes >= 263_304_044_544 and err.available_bytes < err.needed_bytes
    assert [name for name, _ in err.pools][0] == "hca.compressor_tail" and len(err.pools) == 9
    assert err.fields["needed_bytes"] == err.needed_bytes and f"{err.needed_bytes:,}" in str(err)
    assert "hca.compressor_tail" in str(err) and "memory" in err.memory
    small = CacheManager(TINY, ManagerConfig(default_pool_pages=8))  # the executor is still unbound: binds now
    assert set(ex.bind(small.bindings(), small)) == {p.name for p in TINY.pools}


def test_max_bytes_is_the_limit_and_the_estimate_is_enough() -> None:
    m = CacheManager(TINY, ManagerConfig(default_pool_pages=8))
    need = device_estimate(m.bindings()).total
    with pytest.raises(PoolsTooLarge) as info:
        RefExecutor().bind(m.bindings(), m, max_bytes=need - 1)
    assert (info.value.needed_bytes, info.value.available_bytes, info.value.memory) == (need, need - 1, "max_bytes")
    assert RefExecutor().bind(m.bindings(), m, max_bytes=need)
    padded = device_estimate(m.bindings(), padding=True).total  # CudaExecutor over-allocates to align each base
    with pytest.raises(PoolsTooLarge):
        CudaExecutor(numpy_backend()).bind(m.bindings(), m, max_bytes=padded - 1)
    assert CudaExecutor(numpy_backend()).bind(m.bindings(), m, max_bytes=padded)
    for bad in (-1, 1.5, "1", True):
        for ex in (RefExecutor(), CudaExecutor(numpy_backend())):
            with pytest.raises(InvalidArgument) as bad_info:
                ex.bind(m.bindings(), m, max_bytes=bad)  # type: ignore[arg-type]
            assert bad_info.value.argument == "max_bytes" and ex.pools == {}


def test_the_cuda_executor_compares_with_the_devices_free_memory() -> None:
    bindings = [PoolBinding(spec=spec, pages=8) for spec in TINY.pools]
    padded = device_estimate(bindings, padding=True).total
    ex = CudaExecutor(SmallDevice(padded - 1))
    with pytest.raises(PoolsTooLarge) as info:
        ex.bind(bindings, TrustingAuthority())
    assert info.value.memory == "free device memory (test)" and info.value.available_bytes == padded - 1
    assert ex.pools == {}
    with pytest.raises(PoolsTooLarge) as smaller:  # the smaller of max_bytes and the free memory
        CudaExecutor(SmallDevice(padded)).bind(bindings, TrustingAuthority(), max_bytes=padded - 2)
    assert smaller.value.memory == "max_bytes"
    assert CudaExecutor(SmallDevice(padded)).bind(bindings, TrustingAuthority())


def test_available_host_bytes_is_positive_here() -> None:
    found = available_host_bytes()
    assert found is not None and found > 0


def test_the_documented_flash_config_fits_an_80_gb_gpu() -> None:
    estimate = estimate_device_bytes(FLASH, SIZED)
    assert estimate.total == 37_321_170_944 < 80 * 10**9 // 2
    roles = estimate.by_role()
    assert roles == {"prefix": 13_230_333_952, "window": 8_454_848_512, "tail": 15_635_988_480}
    docs = (ROOT / "docs" / "executor.md").read_text()
    for figure in ("37,321,170,944", "13,432,258,560", "10,322,006,016"):
        assert figure in docs, figure
    for name, pages in SIZED.pool_pages.items():
        assert f'"{name}": {pages:_}' in docs, name
    CacheManager(FLASH, SIZED)  # the manager's tables fit too (about 21 MB)
