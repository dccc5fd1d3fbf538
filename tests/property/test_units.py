"""Property tests of hkv_core.units: the one place that converts between units (F12)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hkv_core import units
from hkv_core.errors import UnitError

RATIOS = [0, 1, 4, 8, 16, 32, 64, 128, 256, 1024]
COMPRESSING = [r for r in RATIOS if r >= 1]
ratios = st.sampled_from(RATIOS)
compressing = st.sampled_from(COMPRESSING)
prefixes = st.integers(min_value=0, max_value=10**7)
windows = st.sampled_from([0, 2, 3, 8, 128, 4096])
positive = st.integers(min_value=1, max_value=4096)


@given(prefixes, ratios)
def test_entries_and_remainder_rebuild_the_prefix(p: int, r: int) -> None:
    entries = units.compressed_entries(p, r)
    if r == 0:
        assert entries == 0 and units.tail_rows(p, r) == 0
        return
    assert units.entry_tokens(entries, r) + units.tail_remainder_rows(p, r) == p
    assert 0 <= units.tail_remainder_rows(p, r) < r


@given(prefixes, ratios)
def test_tail_structure(p: int, r: int) -> None:
    overlap = units.tail_overlap_rows(r)
    rows = units.tail_rows(p, r)
    assert rows == overlap + units.tail_remainder_rows(p, r)
    assert units.tail_start_token(p, r) == p - rows
    assert rows <= units.tail_rows_max(r)
    assert overlap == (4 if r == 4 else 0)
    if r >= 4:
        assert units.tail_start_token(p, r) == r * units.compressed_entries(p, r) - overlap
    assert units.tail_padding_rows(p, r) == (4 if r == 4 and p < 4 else 0)
    if r <= 1:
        assert rows == 0 and units.tail_rows_max(r) == 0


@given(prefixes, ratios)
def test_entries_grow_by_one_exactly_when_a_block_completes(p: int, r: int) -> None:
    step = units.compressed_entries(p + 1, r) - units.compressed_entries(p, r)
    completes = r >= 1 and (p + 1) % r == 0  # token p is the last of its block
    assert step == (1 if completes else 0)
    assert units.visible_entries(p, r) == units.compressed_entries(p + 1, r)


@given(st.integers(min_value=0, max_value=10**6), compressing)
def test_entry_positions(j: int, r: int) -> None:
    start, last = units.entry_start_token(j, r), units.entry_last_token(j, r)
    assert last - start + 1 == r == units.tokens_per_entry(r)
    assert units.compressed_entries(last, r) == j
    assert units.compressed_entries(last + 1, r) == j + 1
    assert units.visible_entries(last, r) == j + 1


@given(prefixes, windows)
def test_window_rows(p: int, w: int) -> None:
    rows = units.window_rows(p, w)
    assert 0 <= rows <= min(p, units.window_rows_max(w))
    assert units.window_start_token(p, w) + rows == p
    if w >= 1:
        assert units.window_start_token(p, w) == max(0, p - w + 1)
    assert units.window_rows(p + 1, w) - rows in (0, 1)


@given(st.integers(min_value=0, max_value=10**6), positive)
def test_pages_for_entries_is_ceil(n: int, e: int) -> None:
    pages = units.pages_for_entries(n, e)
    assert units.entries_for_pages(pages, e) >= n
    assert pages == 0 or units.entries_for_pages(pages - 1, e) < n
    if n:
        assert units.page_index_for_entry(n - 1, e) == pages - 1


@given(st.integers(min_value=0, max_value=10**5), positive, compressing)
def test_tokens_entries_pages_agree(n: int, e: int, r: int) -> None:
    tokens = units.entry_tokens(n, r)
    per_page = units.tokens_per_page(e, r)
    assert per_page == e * r
    assert units.pages_for_tokens(tokens, per_page) == units.pages_for_entries(n, e)
    assert units.bytes_for_entries(n, 7) == 7 * n


@given(positive, st.integers(min_value=1, max_value=65536), st.sampled_from([1, 64, 256, 4096]))
def test_aligned_entries_per_page_is_the_smallest_aligned_multiple(
    base: int, size: int, align: int
) -> None:
    entries = units.aligned_entries_per_page(base, size, align)
    assert entries % base == 0 and (entries * size) % align == 0
    assert all((k * base * size) % align for k in range(1, entries // base))


@given(st.integers(min_value=0, max_value=1 << 20))
def test_supported_ratios(r: int) -> None:
    power_of_two = r & (r - 1) == 0
    assert units.is_supported_ratio(r) == (r in (0, 1, 4) or (r >= 8 and power_of_two))


def test_numpy_integers_are_accepted() -> None:
    assert units.compressed_entries(np.int64(1000), np.int32(4)) == 250  # type: ignore[arg-type]
    assert isinstance(units.window_rows(np.int64(1000), 128), int)  # type: ignore[arg-type]


CALLS: list[tuple[str, Callable[..., Any], tuple[int, ...]]] = [
    ("compressed_entries", units.compressed_entries, (1000, 4)),
    ("entry_tokens", units.entry_tokens, (10, 4)),
    ("entry_start_token", units.entry_start_token, (3, 128)),
    ("visible_entries", units.visible_entries, (9, 8)),
    ("tail_rows", units.tail_rows, (1000, 4)),
    ("tail_start_token", units.tail_start_token, (1000, 128)),
    ("window_rows", units.window_rows, (1000, 128)),
    ("window_start_token", units.window_start_token, (1000, 128)),
    ("tokens_per_page", units.tokens_per_page, (64, 4)),
    ("pages_for_entries", units.pages_for_entries, (250, 64)),
    ("pages_for_tokens", units.pages_for_tokens, (1000, 256)),
    ("entries_for_pages", units.entries_for_pages, (4, 64)),
    ("bytes_for_entries", units.bytes_for_entries, (4, 1024)),
    ("aligned_entries_per_page", units.aligned_entries_per_page, (2, 1024, 4096)),
]
BAD_VALUES: list[Any] = [-1, -1000, 1.5, 2.0, "4", None, True, [4]]


@pytest.mark.parametrize(("name", "fn", "args"), CALLS, ids=[c[0] for c in CALLS])
@pytest.mark.parametrize("bad", BAD_VALUES, ids=repr)
def test_bad_arguments_raise_unit_error(
    name: str, fn: Callable[..., Any], args: tuple[int, ...], bad: Any
) -> None:
    fn(*args)  # the good call works
    for position in range(len(args)):
        broken = list(args)
        broken[position] = bad
        with pytest.raises(UnitError):
            fn(*broken)


@pytest.mark.parametrize("ratio", [2, 3, 5, 6, 12, 100, 129])
def test_unsupported_ratios_raise_unit_error(ratio: int) -> None:
    with pytest.raises(UnitError) as info:
        units.compressed_entries(100, ratio)
    assert info.value.fields == {"name": "ratio", "value": ratio}


def test_swa_has_no_tokens_per_entry() -> None:
    with pytest.raises(UnitError):
        units.tokens_per_entry(0)
    with pytest.raises(UnitError):
        units.pages_for_entries(1, 0)
