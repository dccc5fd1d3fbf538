"""Bounds of a CacheManager: every ManagerConfig size has an upper limit (ConfigError beyond it), the
metadata the tables take is estimated before anything is allocated and refused past a limit
(MetadataTooLarge), and the estimate matches what a built manager holds.  Also the block-key options."""

from __future__ import annotations

import os
import time
import tracemalloc
from typing import Any

import numpy as np
import pytest

from hkv_core.block_keys import ALGORITHMS, BlockHasher, ExtraKeys
from hkv_core.errors import ConfigError, InvalidRequestArgument, MetadataTooLarge
from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig, estimate_metadata
from hkv_core.manager import config_bounds as B
from hkv_core.manager.config import default_metadata_limit

UPPER = [
    ("default_pool_pages", B.MAX_POOL_PAGES),
    ("max_requests", B.MAX_REQUESTS),
    ("max_request_tokens", B.MAX_REQUEST_TOKENS),
    ("max_blocks", B.MAX_BLOCK_ROWS),
    ("max_points", B.MAX_POINT_ROWS),
    ("retain_every_blocks", B.MAX_RETAIN_EVERY_BLOCKS),
    ("max_pending_events", B.MAX_PENDING_EVENTS),
]


@pytest.mark.parametrize("flag", ["retain_prompt_end", "allow_partial_page_copy", "debug_checks", "kv_events"])
def test_flags_are_booleans(flag: str) -> None:
    for bad in (1, "yes", None):
        with pytest.raises(ConfigError) as info:
            ManagerConfig(**{flag: bad})
        assert info.value.key == flag and repr(bad) in str(info.value)
    assert getattr(ManagerConfig(**{flag: True}), flag) is True


@pytest.mark.parametrize(("key", "upper"), UPPER)
def test_every_size_has_an_upper_bound(key: str, upper: int) -> None:
    assert getattr(ManagerConfig(**{key: upper}), key) == upper  # the bound itself is accepted
    for bad in (upper + 1, 10**12, 0, -1, 2.0, True):
        with pytest.raises(ConfigError) as info:
            ManagerConfig(**{key: bad})
        assert info.value.source == "ManagerConfig" and info.value.key == key
        assert f"{upper:,}" in str(info.value) and repr(bad) in str(info.value)


def test_pool_pages_by_name_and_alignment_are_bounded_too() -> None:
    with pytest.raises(ConfigError, match=r"pool_pages\[csa.compressed_kv\]: expected an integer in \[1, "):
        ManagerConfig(pool_pages={"csa.compressed_kv": B.MAX_POOL_PAGES + 1})
    for bad in (3, 0, 2 * B.MAX_DEVICE_ALIGNMENT_BYTES, 4.0):
        with pytest.raises(ConfigError) as info:
            ManagerConfig(device_alignment_bytes=bad)  # type: ignore[arg-type]
        assert info.value.key == "device_alignment_bytes"
    assert ManagerConfig(device_alignment_bytes=B.MAX_DEVICE_ALIGNMENT_BYTES).device_alignment_bytes


@pytest.mark.parametrize("bad", [None, [1], [("csa.swa_window", 4)], "csa.swa_window", 8, {3: 8}], ids=repr)
def test_pool_pages_must_be_a_mapping_of_pool_names(bad: object) -> None:
    with pytest.raises(ConfigError) as info:  # not AttributeError ('list' object has no attribute 'items')
        ManagerConfig(pool_pages=bad)  # type: ignore[arg-type]
    assert info.value.source == "ManagerConfig" and info.value.key == "pool_pages"


def test_accepted_abi_is_a_set_of_strings_never_a_bare_string() -> None:
    layout = Layout.from_preset("tiny_v4")
    ids = [p.abi_id for p in layout.pools]
    for bad in (5, ids[0], ids[0].encode(), {5}, (ids[0], None)):
        with pytest.raises(ConfigError) as info:  # a string would match by substring; 5 failed at the first match
            ManagerConfig(accepted_abi=bad)  # type: ignore[arg-type]
        assert info.value.source == "ManagerConfig" and info.value.key == "accepted_abi"
    for given in (frozenset(ids), set(ids), tuple(ids), list(ids)):
        config = ManagerConfig(accepted_abi=given, key_seed=0)  # type: ignore[arg-type]
        assert config.accepted_abi == frozenset(ids) and isinstance(config.accepted_abi, frozenset)
        tokens, codes = _resumed(CacheManager(layout, config))
        assert tokens == 40 and "ABI_MISMATCH" not in codes
    fewer = ManagerConfig(accepted_abi=sorted(set(ids))[1:], key_seed=0)  # type: ignore[arg-type]
    tokens, codes = _resumed(CacheManager(layout, fewer))
    assert tokens == 0 and "ABI_MISMATCH" in codes
    assert ManagerConfig().accepted_abi is None


def _resumed(m: CacheManager) -> tuple[int, tuple[str, ...]]:
    """Tokens and reason codes of a follow-up's hit on a 40-token prompt computed before."""
    first = m.add_request(np.arange(40))
    m.allocate(first, 40)
    m.commit(first, 40)
    m.release(first)
    hit = m.match(m.add_request(np.arange(48)))
    return hit.tokens, hit.codes


def test_a_trillion_pages_is_refused_at_once_with_a_typed_error() -> None:
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(ConfigError) as info:
            CacheManager(Layout.from_preset("tiny_v4"), ManagerConfig(default_pool_pages=10**12))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.key == "default_pool_pages"
    assert time.perf_counter() - start < 5 and peak < 16 << 20


def test_pools_within_their_bounds_whose_tables_do_not_fit_are_refused_before_allocating() -> None:
    layout = Layout.from_preset("deepseek_v4_flash", block_tokens=16)
    config = ManagerConfig(default_pool_pages=B.MAX_POOL_PAGES, max_blocks=1000, max_points=100)
    estimate = estimate_metadata(layout, config)
    assert estimate.total > estimate.limit_bytes == default_metadata_limit()
    tracemalloc.start()
    try:
        with pytest.raises(MetadataTooLarge) as info:
            CacheManager(layout, config)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    err = info.value
    assert isinstance(err, ConfigError) and err.key == "max_metadata_bytes"
    assert (err.needed_bytes, err.limit_bytes) == (estimate.total, estimate.limit_bytes)
    assert (err.largest, err.largest_bytes) == estimate.largest == ("objects", estimate.tables["objects"])
    assert err.fields["needed_bytes"] == estimate.total and f"{estimate.total:,}" in str(err)
    assert peak < 16 << 20, f"{peak} bytes allocated before refusing"


def test_max_metadata_bytes_is_the_limit_and_the_estimate_is_enough() -> None:
    layout = Layout.from_preset("tiny_v4")
    need = estimate_metadata(layout, ManagerConfig(default_pool_pages=64)).total
    with pytest.raises(MetadataTooLarge) as info:
        CacheManager(layout, ManagerConfig(default_pool_pages=64, max_metadata_bytes=need - 1))
    assert (info.value.needed_bytes, info.value.limit_bytes) == (need, need - 1)
    m = CacheManager(layout, ManagerConfig(default_pool_pages=64, max_metadata_bytes=need))
    assert m.core.metadata.total == need and m.core.metadata.fits
    for bad in (0, -1, 1.5, "1"):
        with pytest.raises(ConfigError) as bad_info:
            ManagerConfig(max_metadata_bytes=bad)  # type: ignore[arg-type]
        assert bad_info.value.key == "max_metadata_bytes"


def test_derived_capacities_past_their_bounds_are_config_errors() -> None:
    layout = Layout.from_preset("llama_full")
    with pytest.raises(ConfigError, match="block rows, more than") as info:
        estimate_metadata(layout, ManagerConfig(default_pool_pages=B.MAX_POOL_PAGES))
    assert info.value.key == "max_blocks"
    flash = Layout.from_preset("deepseek_v4_flash", block_tokens=16)
    # pools of different sizes are page pools of their own: nine of about 2**28 pages pass 2**31 object ids
    sizes = {spec.name: B.MAX_POOL_PAGES - i for i, spec in enumerate(flash.pools)}
    assert sum(sizes.values()) > B.MAX_OBJECTS
    with pytest.raises(ConfigError, match="objects together") as objects:
        estimate_metadata(flash, ManagerConfig(pool_pages=sizes, max_blocks=10, max_points=10))
    assert objects.value.key == "pool_pages"


def test_default_metadata_limit_is_half_of_physical_memory() -> None:
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert default_metadata_limit() == physical // B.METADATA_MEMORY_SHARE
    assert ManagerConfig().metadata_limit() == default_metadata_limit()
    assert ManagerConfig(max_metadata_bytes=123).metadata_limit() == 123


def test_default_metadata_limit_falls_back_where_memory_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    def unknown(name: str) -> int:
        raise ValueError(name)

    monkeypatch.setattr(os, "sysconf", unknown)
    assert default_metadata_limit() == B.METADATA_FALLBACK_BYTES


def _array_bytes(root: object) -> int:
    """Bytes of every distinct NumPy buffer reachable from `root` (views counted once, at their base)."""
    seen: set[int] = set()
    buffers: dict[int, int] = {}
    todo = [root]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, np.ndarray):
            base = x
            while isinstance(base.base, np.ndarray):
                base = base.base
            buffers[id(base)] = base.nbytes
        elif isinstance(x, dict):
            todo += list(x.values())
        elif isinstance(x, list | tuple | set | frozenset):
            todo += list(x)
        elif not isinstance(x, str | bytes | int | float | type(None)):
            todo += list(getattr(x, "__dict__", {}).values())
            todo += [getattr(x, s) for s in getattr(type(x), "__slots__", ()) if hasattr(x, s)]
    return sum(buffers.values())


TOLERANCE, SLACK_BYTES = 0.01, 64 << 10  # the stated tolerance (footprint.py): 1 % plus 64 KiB


@pytest.mark.parametrize(("preset", "block", "config"), [
    ("tiny_v4", None, {"default_pool_pages": 64}),
    ("tiny_csa", None, {"default_pool_pages": 300, "max_requests": 3}),
    ("deepseek_v4_flash", 16, {"default_pool_pages": 2000, "retain_every_blocks": 4}),
    ("llama_full", None, {"default_pool_pages": 5000, "max_requests": 100}),
    ("swa_full", None, {}),
])
def test_the_estimate_matches_the_arrays_a_built_manager_holds(preset: str, block: int | None,
                                                               config: dict[str, Any]) -> None:
    layout = Layout.from_preset(preset, block_tokens=block) if block else Layout.from_preset(preset)
    cfg = ManagerConfig(**config)
    estimate = estimate_metadata(layout, cfg)
    m = CacheManager(layout, cfg)
    m.core.index.keys.scratch = np.empty(len(m.core.index.keys.ids), np.int32)  # what the first insert allocates
    lists = 2 * 8 * m.core.limits.max_requests  # the request table's by_slot and free_slots (pointers)
    real = _array_bytes(m.core) + lists
    assert abs(estimate.total - real) <= TOLERANCE * real + SLACK_BYTES, (estimate.tables, real)
    assert m.core.metadata == estimate


# ---------------------------------------------------------------------------------------------- block keys


def _keys(config: ManagerConfig, tokens: np.ndarray) -> np.ndarray:
    m = CacheManager(Layout.from_preset("llama_full"), config)
    return m.core.requests.by_rid[m.add_request(tokens)].keys


def test_key_seed_shared_makes_keys_comparable_and_is_never_printed() -> None:
    tokens = np.arange(64)
    seed = 0xDEC0DE_5EED_0123
    a, b = _keys(ManagerConfig(key_seed=seed), tokens), _keys(ManagerConfig(key_seed=seed), tokens)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, _keys(ManagerConfig(key_seed=seed + 1), tokens))
    assert not np.array_equal(_keys(ManagerConfig(), tokens), _keys(ManagerConfig(), tokens))  # secret per manager
    config = ManagerConfig(key_seed=seed)
    for text in (repr(config), str(config)):
        assert str(seed) not in text and hex(seed)[2:] not in text and "key_seed=<secret>" in text
    assert "key_seed=None" in repr(ManagerConfig())
    for bad in (-1, 2**64, "1", True, 1.0):
        with pytest.raises(ConfigError) as info:
            ManagerConfig(key_seed=bad)  # type: ignore[arg-type]
        assert info.value.key == "key_seed" and str(bad) not in info.value.reason


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_block_hash_selects_the_hashers_algorithm(algorithm: str) -> None:
    tokens = np.arange(64)
    keys = _keys(ManagerConfig(key_seed=7, block_hash=algorithm), tokens)
    layout = Layout.from_preset("llama_full")
    direct = BlockHasher(block_tokens=layout.block_tokens, seed=7, algorithm=algorithm,
                         namespace=layout.fingerprint()).hash_blocks(tokens, ExtraKeys())
    assert np.array_equal(keys, direct)
    other = next(a for a in ALGORITHMS if a != algorithm)
    assert not np.array_equal(keys, _keys(ManagerConfig(key_seed=7, block_hash=other), tokens))


def test_an_unknown_block_hash_lists_the_choices() -> None:
    assert ManagerConfig().block_hash == "xxh3_128"
    with pytest.raises(ConfigError, match="unknown block hash 'md5'; the choices: xxh3_128, sha256") as info:
        ManagerConfig(block_hash="md5")
    assert info.value.key == "block_hash"


def test_retained_boundaries_is_bounded_by_the_request_and_validated() -> None:
    m = CacheManager(Layout.from_preset("deepseek_v4_flash", block_tokens=16),
                     ManagerConfig(default_pool_pages=64, key_seed=1, retain_every_blocks=1))
    rid = m.add_request(np.arange(20))
    assert m.retained_boundaries(rid, 0, 20) == [16]
    assert m.retained_boundaries(rid, 16, 16) == [] and m.retained_boundaries(rid, np.int64(0), 16) == [16]
    before = m.snapshot()
    for start, end, argument in [(0, 10**9, "end"), (-100, 10**12, "start"), (0, 21, "end"), (5, 4, "end"),
                                 (-1, 20, "start"), (0.0, 20, "start"), (0, "20", "end"), (True, 20, "start"),
                                 (0, None, "end")]:
        tracemalloc.start()
        try:
            with pytest.raises(InvalidRequestArgument) as info:
                m.retained_boundaries(rid, start, end)  # type: ignore[arg-type]
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert info.value.argument == argument and info.value.action == "retained_boundaries", (start, end)
        assert peak < 1 << 20, (start, end, peak)  # nothing built for the range (it was 363 MB)
    assert m.snapshot() == before
