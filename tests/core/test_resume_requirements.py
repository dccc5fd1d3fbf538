"""resume_requirements equals a direct enumeration of the positions each layer still needs.

The enumeration follows docs/v4_cache.md sections 2, 4, 5 from the reading side: a
position's state is needed at P iff some computation at a position >= P reads
it.  Compressed entries: blocks completed by a token < P.  Tail: rows (of
positions < P) pooled by a block not yet emitted, i.e. block floor(P/r) and
for r = 4 also its successor, which reads the previous block as its overlap;
positions below 0 are padding.  Window: the raw rows the query at P reads
(later queries read a subset of those below P).
"""

from __future__ import annotations

import pytest

from hkv_core import units
from hkv_core.errors import UnitError
from hkv_core.layout import Layout
from hkv_core.layout.records import LayerGroup
from hkv_core.layout.resume import GroupRequirements, resume_requirements

PREFIXES = range(0, 600)
PRESETS = ["tiny_v4", "deepseek_v4_flash", "swa_full", "llama_full"]


def completed_entries(r: int, p: int) -> list[int]:
    if r == 0:
        return []
    return [j for j in range(p + 1) if j * r + r - 1 < p]


def tail_positions(r: int, p: int) -> list[int]:
    if r == 0:
        return []
    open_block = p // r
    needed: set[int] = set()
    for block in (open_block, open_block + 1):
        pooled = list(range(block * r, block * r + r))
        if r == 4:  # the overlapping compressor also pools the previous block
            pooled += range((block - 1) * r, block * r)
        needed |= {t for t in pooled if t < p}
    return sorted(needed)


def window_positions(w: int, p: int) -> list[int]:
    return [u for u in range(p) if w and p - w + 1 <= u <= p]


def check_group(group: LayerGroup, req: GroupRequirements, layout: Layout, p: int) -> None:
    r, w = group.compress_ratio, group.window_tokens
    entries, tail, window = completed_entries(r, p), tail_positions(r, p), window_positions(w, p)
    assert req.compressed_entries == len(entries)
    assert req.compressed_tokens == (0, len(entries) * r)
    assert req.indexer_keys == (len(entries) if group.has_indexer else 0)
    assert req.tail.total == len(tail)
    assert req.tail.start_token == (tail[0] if tail else p)
    assert req.tail.padding == sum(1 for t in tail if t < 0)
    assert req.tail.remainder == sum(1 for t in tail if t >= (p // r) * r) if r else True
    assert req.tail.overlap == (4 if r == 4 else 0)
    assert req.indexer_tail == (req.tail if group.has_indexer else None)
    assert req.window_rows == len(window)
    assert req.window_token_range == ((window[0], p) if window else (p, p))
    counts = {"compressed_entry": len(entries), "tail_row": len(tail), "window_row": len(window)}
    pools = layout.pools_of(group.name)
    expected = sum(counts[pool.entry_kind.value] * pool.entry_bytes for pool in pools)
    assert req.bytes_per_layer == expected
    assert req.bytes == expected * group.layer_count


@pytest.mark.parametrize("name", PRESETS)
def test_requirements_equal_enumeration(name: str) -> None:
    layout = Layout.from_preset(name)
    for p in PREFIXES:
        req = resume_requirements(layout, p)
        assert req.prefix_tokens == p
        for group, group_req in zip(layout.all_groups, req.groups + req.mtp_groups, strict=True):
            assert group_req.group_name == group.name
            check_group(group, group_req, layout, p)
        assert req.bytes == sum(g.bytes for g in req.groups)


def test_every_layer_maps_to_its_group() -> None:
    layout = Layout.from_preset("deepseek_v4_flash")
    req = resume_requirements(layout, 1000)
    for layer in range(layout.main_layers + layout.mtp_layers):
        assert req.for_layer(layer).group_name == layout.group_of_layer(layer).name
    with pytest.raises(KeyError):
        req.for_layer(44)


def test_overlap_is_padding_before_the_first_block() -> None:
    req = resume_requirements(Layout.from_preset("tiny_v4"), 3).for_layer(1)
    assert (req.tail.overlap, req.tail.remainder, req.tail.padding) == (4, 3, 4)
    assert req.tail.start_token == -4 and units.tail_padding_rows(4, 4) == 0


def test_negative_prefix_is_a_unit_error() -> None:
    with pytest.raises(UnitError):
        resume_requirements(Layout.from_preset("tiny_v4"), -1)
