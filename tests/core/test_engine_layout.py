"""`engine_layout`: an engine's own cache groups (vLLM's KV cache groups) as an hkv layout, each group its own
block size, dtype and KV shape."""

import pytest

from hkv_core.errors import ConfigError
from hkv_core.layout import EngineGroup, engine_layout
from hkv_core.manager import CacheManager, ManagerConfig, check_invariants


def group(window=0, page=8, dtype="fp32", heads=1, dim=4):
    return EngineGroup(window_tokens=window, tokens_per_page=page, kv_dtype=dtype, num_kv_heads=heads, head_dim=dim)


def build(groups, block=8):
    return engine_layout(groups, name="e", block_tokens=block, alignment_bytes=16, source="test")


def test_groups_of_one_geometry_share_a_pool_and_the_others_get_their_own():
    layout, pools = build([group(page=32, dtype="fp16"), group(window=8), group(page=32, dtype="fp16"),
                           group(window=16), group(page=16, heads=2)])
    assert pools == ("full0.compressed_kv", "swa0.swa_window", "full0.compressed_kv", "swa1.swa_window",
                     "full1.compressed_kv")
    by_name = {p.name: p for p in layout.pools}
    assert {n: (p.tokens_per_page, p.dtype, p.entry_shape, p.layer_count) for n, p in by_name.items()} == {
        "full0.compressed_kv": (32, "fp16", (2, 1, 4), 2), "swa0.swa_window": (8, "fp32", (2, 1, 4), 1),
        "swa1.swa_window": (8, "fp32", (2, 1, 4), 1), "full1.compressed_kv": (16, "fp32", (2, 2, 4), 1)}
    # bytes per page, computed by hand: tokens x (K and V) x heads x dim x dtype bytes
    assert [by_name[n].page_bytes for n in ("full0.compressed_kv", "swa0.swa_window", "full1.compressed_kv")] == [
        32 * 2 * 1 * 4 * 2, 8 * 2 * 1 * 4 * 4, 16 * 2 * 2 * 4 * 4]
    assert {g.name: g.window_tokens for g in layout.groups} == {"full0": 0, "swa0": 8, "swa1": 16, "full1": 0}
    assert layout.model_type == "engine" and layout.block_tokens == 8 and layout.window_tokens == 16


def test_one_group_of_each_kind_keeps_the_plain_names():
    layout, pools = build([group(page=16), group(window=32)])
    assert pools == ("full.compressed_kv", "swa.swa_window")


def test_hits_land_where_every_pages_end_or_anywhere_with_partial_copies():
    layout, pools = build([group(page=32), group(window=8)])
    for partial, want in ((False, 64), (True, 88)):
        m = CacheManager(layout, ManagerConfig(pool_pages={p: 40 for p in set(pools)}, max_requests=4,
                                               max_request_tokens=512, retain_every_blocks=1,
                                               allow_partial_page_copy=partial))
        rid = m.add_request(list(range(88)))
        m.allocate(rid, 88)
        m.commit(rid, 88)
        m.release(rid)
        hit = m.match(m.add_request(list(range(88)) + [5]))
        assert hit.tokens == want, (partial, hit.codes)
        assert len(hit.pages["full.compressed_kv"]) == -(-want // 32)
        assert len(hit.pages["swa.swa_window"]) == 1  # an 8-token window before the point: one block


@pytest.mark.parametrize(("groups", "key", "words"), [
    ([group(page=12)], "groups[0]", "whole number of hkv blocks"),
    ([group(page=8), group(window=16, page=12)], "groups[1]", "whole number of hkv blocks"),
    ([group(window=1)], "groups[0]", "window_tokens"),
    ([group(dtype="int8")], "groups[0]", "kv_dtype"),
    ([group(heads=0)], "groups[0].num_kv_heads", "must be an int"),
    ([group(page=True)], "groups[0].tokens_per_page", "must be an int"),
    ([], "groups", "1 to"),
    (["full"], "groups[0]", "EngineGroup"),
])
def test_a_group_hkv_cannot_hold_is_refused_by_name(groups, key, words):
    with pytest.raises(ConfigError) as err:
        build(groups)
    assert err.value.key == key and words in str(err.value)


def test_a_page_that_alignment_would_widen_is_refused():
    with pytest.raises(ConfigError) as err:
        engine_layout([group(page=8, dim=1, dtype="fp16")], name="e", block_tokens=8, alignment_bytes=64,
                      source="test")  # 8 tokens x 4 bytes = 32 bytes, not a multiple of 64
    assert err.value.key == "groups[0]" and "alignment_bytes" in str(err.value)


@pytest.mark.parametrize("block", [0, 1 << 20, 2.0])
def test_block_tokens_out_of_bounds_is_refused(block):
    with pytest.raises(ConfigError) as err:
        build([group()], block=block)
    assert err.value.key == "block_tokens"


# ----------------------------------------------------------- window pages of several blocks

def _served(m, tokens, commit_upto=None):
    rid = m.add_request(tokens)
    hit = m.match(rid)
    if hit.tokens:
        m.acquire(rid, hit)
    start = hit.tokens
    m.allocate(rid, len(tokens) - start)
    m.commit(rid, (commit_upto or len(tokens)) - start)
    return rid, hit


def test_window_pages_of_two_blocks_resume_on_page_boundaries_with_the_window_they_read():
    """An 8-token window page over 4-token blocks (a 12-token window): points, and so hits, lie on page
    boundaries only; the hit holds exactly the pages over [P - 11, P); the window slides a page at a time."""
    layout, pools = build([group(page=8), group(window=12, page=8)], block=4)
    m = CacheManager(layout, ManagerConfig(pool_pages={p: 32 for p in set(pools)}, max_requests=4,
                                           max_request_tokens=512, retain_every_blocks=1))
    rid, _ = _served(m, list(range(44)))  # the prompt ends inside a window page: no point at 44
    assert check_invariants(m) == []
    table = m.tables(rid)["swa.swa_window"]
    assert table[:4] == [0, 0, 0, 0] and all(table[4:6])  # [33, 44) reads pages 4 and 5 only: 0..3 went back
    m.release(rid)
    rid2, hit = _served(m, list(range(44)) + [7, 8, 9])
    assert hit.tokens == 40  # the last page boundary with a point (prompt end 44 is inside a page)
    swa = m.core.roles[1]
    assert swa.first_page(0, 40) == 3 and len(hit.pages["swa.swa_window"]) == 2  # [29, 40): pages 3 and 4
    owners = m.pages("swa.swa_window", hit.pages["swa.swa_window"]).states
    assert set(owners) == {"PUBLISHED"}
    assert check_invariants(m) == []
    m.release(rid2)
    assert check_invariants(m) == []


def test_a_window_page_is_never_shared_before_it_is_whole():
    """A request that stops inside a window page keeps no point there, so no other request reads the
    page's missing rows: its hit ends on the page boundary before."""
    layout, pools = build([group(page=8), group(window=12, page=8)], block=4)
    m = CacheManager(layout, ManagerConfig(pool_pages={p: 32 for p in set(pools)}, max_requests=4,
                                           max_request_tokens=512, retain_every_blocks=1))
    rid, _ = _served(m, list(range(60)), commit_upto=52)  # committed 52: inside the page [48, 56)
    rid2, hit = _served(m, list(range(60)) + [1])
    assert hit.tokens == 48
    for r in (rid, rid2):
        m.release(r)
    assert check_invariants(m) == []


# ----------------------------------------------------------- a request's ring (scratch pages)

def test_a_ring_is_one_private_page_per_request_never_shared_and_given_back():
    """vLLM's CircularBufferSpec (DeepSeek-V4.1's compressor ring) as hkv's scratch role: each request gets one
    page at its first allocation, keeps it for its life, never publishes it; a hit needs nothing of it (the
    second request resumes with its own, fresh ring) and release gives it back."""
    ring = EngineGroup(window_tokens=0, tokens_per_page=2, kv_dtype="fp32", num_kv_heads=1, head_dim=8, ring=True)
    layout, pools = build([group(page=8), group(window=16, page=4), ring], block=4)
    assert layout.pool(pools[2]).entry_kind.value == "ring_row" and pools[2] == "ring.compressor_tail.ring"
    m = CacheManager(layout, ManagerConfig(pool_pages={p: 32 for p in set(pools)}, max_requests=4,
                                           max_request_tokens=512, retain_every_blocks=1))
    a, _ = _served(m, list(range(40)))
    assert len(m.tables(a)[pools[2]]) == 1 and m.pages(pools[2], m.tables(a)[pools[2]]).states == ("RESERVED",)
    b, hit = _served(m, list(range(40)) + [9, 9, 9])
    assert hit.tokens == 40 and len(hit.pages[pools[2]]) == 0  # a hit reads nothing of a ring
    assert m.tables(b)[pools[2]] != m.tables(a)[pools[2]]  # each request its own page
    assert check_invariants(m) == []
    m.release(a)
    m.release(b)
    assert m.free_pages(pools[2]) == 32 and check_invariants(m) == []


def test_a_ring_with_a_window_is_refused():
    bad = EngineGroup(window_tokens=8, tokens_per_page=2, kv_dtype="fp32", num_kv_heads=1, head_dim=8, ring=True)
    with pytest.raises(ConfigError, match="a ring has no window"):
        build([group(page=8), bad], block=4)


@pytest.mark.parametrize(("fields", "why"), [(dict(window_tokens=8, state=True), "state columns have no window"),
                                             (dict(ring=True, state=True), "a ring or state columns, not both")])
def test_a_state_group_with_a_window_or_a_ring_is_refused(fields, why):
    bad = EngineGroup(**{**dict(window_tokens=0, tokens_per_page=8, kv_dtype="fp32", num_kv_heads=1, head_dim=8),
                         **fields})
    with pytest.raises(ConfigError, match=why):
        build([group(page=8), bad], block=4)


def test_a_state_group_is_a_linear_layer_with_state_columns():
    layout, pools = build([group(page=8), EngineGroup(window_tokens=0, tokens_per_page=8, kv_dtype="fp32",
                                                      num_kv_heads=1, head_dim=8, state=True)], block=4)
    spec = layout.pool(pools[1])
    assert (spec.object_kind.value, spec.entry_kind.value, spec.tokens_per_page) == ("recurrent_state",
                                                                                     "state_column", 8)
    assert layout.group(spec.group_name).kind.value == "LINEAR"
