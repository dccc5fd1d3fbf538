"""Every object kind of every group round-trips pools -> host -> disk -> pools bit-exact, on real layouts (F4, F13).

A request's pages are filled with random bytes (every entry, window row and tail
row of its allocation); its block records and its point record are read, stored
on the host, checked back, moved to disk, checked back, and written into a second
request's fresh allocation through the manager, where they must read back equal.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hkv_core import Layout
from hkv_core.layout import ObjectKind
from hkv_core.manager import CacheManager, ManagerConfig
from hkv_exec_ref.executor import NUMPY_DTYPES, RefExecutor
from hkv_tiers import TierCache, span_io
from hkv_tiers.record_check import Wanted


def fill(executor: RefExecutor, manager: CacheManager, alloc: span_io.Allocation, seed: int) -> None:
    """Random bytes in every slot the allocation writes and in its tail pages."""
    rng = np.random.default_rng(seed)
    for binding in manager.bindings():
        spec = binding.spec
        dtype = NUMPY_DTYPES[spec.dtype]
        if spec.snapshot:  # tail rows, or a linear layer's recurrent state
            slots = alloc.tail_pages[spec.name] * spec.entries_per_page + np.arange(spec.entries_per_page)
        else:
            slots = alloc.slots[spec.name]
        values = rng.integers(0, 2**15, (len(slots), spec.layer_count, *spec.entry_shape)).astype(dtype)
        executor.write(spec.name, slots, values)


def records(manager: CacheManager, executor: RefExecutor, rid: int, layout: Layout, pools: tuple[span_io.PoolSpec, ...],
            alloc: span_io.Allocation, end: int) -> dict[tuple[str, int], span_io.Arrays]:
    """The block records of every block up to `end` and the point record at `end`."""
    b = layout.block_tokens
    out = {(span_io.BLOCK, hi): span_io.read(manager, executor, rid, layout, pools, span_io.BLOCK, alloc, hi - b, hi)
           for hi in range(b, end + 1, b)}
    lo = span_io.token_range(layout, span_io.POINT, end - b, end)[0]
    out[(span_io.POINT, end)] = span_io.read(manager, executor, rid, layout, pools, span_io.POINT, alloc, lo, end)
    return out


def same(a: span_io.Arrays, b: span_io.Arrays) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("preset", ["deepseek_v4_flash", "tiny_v4", "tiny_csa", "mistral_swa", "tiny_v32",
                                    "tiny_linear"])
def test_records_round_trip_through_every_tier_bit_exact(tmp_path: Path, preset: str) -> None:
    layout = Layout.from_preset(preset)
    manager = CacheManager(layout, ManagerConfig(default_pool_pages=6, key_seed=1))
    executor = RefExecutor()
    executor.bind(manager.bindings(), manager)
    pools = tuple(binding.spec for binding in manager.bindings())
    kinds = {(p.group_name, p.object_kind) for p in pools}
    held = {(p.group_name, p.object_kind) for kind in span_io.KINDS for p in span_io.pools_of(pools, kind)}
    assert held == kinds  # records hold every kind: windows, or (tiny_v32) the indexer keys beside the latent
    special = {"tiny_v32": ObjectKind.INDEXER_STATE, "tiny_linear": ObjectKind.RECURRENT_STATE}
    assert any(k is special.get(preset, ObjectKind.SWA_WINDOW) for _, k in kinds)
    end = 2 * layout.block_tokens
    prompt = np.arange(end + 1) % 1000

    first = manager.add_request(prompt)
    manager.acquire(first, manager.match(first))
    alloc = manager.allocate(first, end)
    fill(executor, manager, alloc, seed=len(preset))
    stored = records(manager, executor, first, layout, pools, alloc, end)
    keys = manager.block_keys(first)
    manager.commit(first, end)
    manager.release(first)
    manager.clear_cache()

    cache = TierCache(pools=pools, layout_fingerprint=layout.fingerprint(), model_id=preset, key_seed=1,
                      host_bytes=1 << 28, directory=tmp_path, disk_bytes=1 << 28)
    wanted = []
    for (kind, hi), arrays in stored.items():
        lo, stop = span_io.token_range(layout, kind, hi - layout.block_tokens, hi)
        want = Wanted(kind, keys[hi // layout.block_tokens - 1], lo, stop)
        cache.put(kind, want.key, lo, stop, span_io.encode(pools, kind, arrays))
        wanted.append(want)
    for tier in ("host", "disk"):
        for want, got in zip(wanted, cache.fetch(wanted), strict=True):
            assert got is not None and got[0] == tier
            block_lo = want.hi - layout.block_tokens if want.kind == span_io.BLOCK else want.lo
            decoded = span_io.decode(layout, pools, want.kind, got[1], block_lo, want.hi)
            assert same(decoded, stored[(want.kind, want.hi)]), (tier, want)
        if tier == "host":
            cache.evict("host")

    second = manager.add_request(prompt)
    manager.acquire(second, manager.match(second))
    alloc = manager.allocate(second, end)
    for (kind, hi), arrays in stored.items():
        lo = hi - layout.block_tokens if kind == span_io.BLOCK else span_io.token_range(layout, kind, 0, hi)[0]
        span_io.write(manager, executor, second, layout, pools, kind, alloc, lo, hi, arrays, last=hi == end)
    assert all(same(got, stored[k]) for k, got in records(manager, executor, second, layout, pools, alloc, end).items())
    manager.commit(second, end)
    manager.release(second)
    cache.close()
