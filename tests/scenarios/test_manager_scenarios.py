"""Scenario tests of the cache manager with exact expected values.

Every scenario is built by a `scenario_*` helper (listed in SCENARIOS) that
drives a manager and returns what it observed; the tests assert exact hit
lengths, reason codes, page ids, copies and which blocks survive eviction.
`test_reason_codes.py` runs the same helpers and checks that together they
produce every reason code of specs/validation.toml.

Page ids are deterministic: every page pool hands out its lowest free page
first and a freed page is the next one handed out; pools that share a page
pool (the windows of all layer groups, the compressor tails) hand out the
same ids.  Versions are unique stamps, so they are compared with what
`m.pages(...)` reports, never as literals.  Scenarios that assert exact
eviction pass `evict_slack_shift=None`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
import pytest

from hkv_core.errors import InvalidTokens
from hkv_core.layout import Layout
from hkv_core.manager import (
    NULL_PAGE,
    AdmissionRejected,
    Allocation,
    CacheManager,
    CopyPages,
    Hit,
    InvalidRequestState,
    ManagerConfig,
    OutOfPages,
    StaleLease,
    UnknownRequest,
    check_invariants,
)
from hkv_core.plan import Completion
from hkv_core.testing.brute_force import brute_force_hit_tokens

FRESH = 50_000  # token ids >= FRESH never occur in a cached prefix: a block made of them always misses
WINDOWS = ("swa.swa_window", "csa.swa_window", "hca.swa_window")  # one page pool on the V4 layouts


def tiny() -> Layout:
    return Layout.from_preset("tiny_v4")


def flash16() -> Layout:
    return Layout.from_preset("deepseek_v4_flash", block_tokens=16)


def llama() -> Layout:
    return Layout.from_preset("llama_full")


def tokens_of(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, count, dtype=np.int64)


def fresh(count: int, start: int = 0) -> np.ndarray:
    return np.arange(FRESH + start, FRESH + start + count, dtype=np.int64)


@attrs.define
class Outcome:
    """What a scenario observed: its manager, named hits, allocations and request ids."""

    m: CacheManager
    hits: dict[str, Hit] = attrs.field(factory=dict)
    allocs: dict[str, Allocation] = attrs.field(factory=dict)
    rids: dict[str, int] = attrs.field(factory=dict)
    notes: dict[str, Any] = attrs.field(factory=dict)


def run_copies(m: CacheManager, alloc: Allocation) -> None:
    """What an executor does with an allocation's plan: run it and report it done."""
    if alloc.plan is not None:
        m.complete(alloc.plan.plan_id, Completion())


def kept(alloc: Allocation) -> Allocation:
    """The allocation with copies of its arrays (its block tables may be views of the request's tables,
    valid until the next call that changes them)."""
    return attrs.evolve(alloc, block_tables={k: v.copy() for k, v in alloc.block_tables.items()},
                        slots={k: v.copy() for k, v in alloc.slots.items()})


def compute(m: CacheManager, tokens: np.ndarray, *, upto: int | None = None, chunk: int | None = None,
            release: bool = True, **extra: Any) -> tuple[int, Hit, list[Allocation]]:
    """Add a request, match + acquire its hit, allocate (running its copies) and commit up to `upto`
    tokens in chunks."""
    rid = m.add_request(tokens, **extra)
    hit = m.match(rid)
    m.acquire(rid, hit)
    end = len(tokens) if upto is None else upto
    allocs = []
    while (done := m.request_tokens(rid)[0]) < end:
        count = end - done if chunk is None else min(chunk, end - done)
        alloc = m.allocate(rid, count)
        allocs.append(kept(alloc))
        run_copies(m, alloc)
        m.commit(rid, count)
    if release:
        m.release(rid)
    return rid, hit, allocs


def probe(m: CacheManager, tokens: np.ndarray, **extra: Any) -> Hit:
    """The hit a fresh request for `tokens` would get (the request is released again).

    Every probe is also checked against the naive reference (hkv_core.testing.brute_force), and must be
    acquirable as it is (match and acquire agree on what a usable resume point is).
    """
    rid = m.add_request(tokens, **extra)
    try:
        hit = m.match(rid)
        assert hit.tokens == brute_force_hit_tokens(m, rid)
        m.clone().acquire(rid, attrs.evolve(hit))  # a copy: acquire re-derives its pages from the index
        return hit
    finally:
        m.release(rid)


def page_state(m: CacheManager, pool: str, page: int) -> str:
    return m.pages(pool, [page]).states[0]


def states(m: CacheManager, pool: str, pages: list[int]) -> list[str]:
    return list(m.pages(pool, pages).states)


def alive_positions(m: CacheManager, tokens: np.ndarray) -> int:
    """How many leading blocks of `tokens` (no salt, no LoRA) are still indexed (key lookups only)."""
    keys = m.core.hasher.hash_blocks(tokens)
    ids = m.core.index.keys.lookup(keys)
    missing = np.flatnonzero(ids < 0)
    return int(missing[0]) if missing.size else len(ids)


def block_ids(m: CacheManager, tokens: np.ndarray) -> list[int]:
    """Block ids of the complete blocks of `tokens` (-1 where not indexed)."""
    return m.core.index.keys.lookup(m.core.hasher.hash_blocks(tokens)).tolist()


def boundary_of(m: CacheManager, block: int) -> int:
    """The token boundary at the end of indexed block `block` (its depth in its chain, by parent links)."""
    parent, depth = m.core.index.blocks.parent, 1
    while (block := int(parent[block])) >= 0:
        depth += 1
    return depth * m.layout.block_tokens


def kept_points(m: CacheManager) -> list[int]:
    """Token boundaries of every resume point the index keeps, ascending (duplicates for other chains)."""
    points = m.core.index.points
    kept = points.table.state_id("KEPT")
    return sorted(boundary_of(m, int(points.block[r])) for r in np.flatnonzero(points.state == kept))


def point_window_pages(m: CacheManager, block: int) -> list[int]:
    """The window pages (page ids of the shared window page pool) the point kept on `block` refers to."""
    points, o = m.core.index.points, m.core.objects
    row = int(m.core.index.blocks.point[block])
    assert row >= 0 and points.table.states[int(points.state[row])] == "KEPT", (block, kept_points(m))
    col = next(c for c, (pool, _) in enumerate(points.refs) if "swa.swa_window" in pool.spec.member_names)
    objs = points.refs[col][1][row]
    return [int(o.slot[x]) for x in objs if x]


def window_pages(allocs: list[Allocation], block_tokens: int, pool: str = "swa.swa_window") -> list[int]:
    """The window page each block of a request was written to, over all its allocations."""
    pages: list[int] = []
    for alloc in allocs:
        first, last = alloc.start_tokens // block_tokens, (alloc.start_tokens + alloc.num_tokens - 1) // block_tokens
        table = alloc.block_tables[pool].tolist()
        pages = pages[:first] + [NULL_PAGE] * (first - len(pages)) + table[first:last + 1]
    return pages


# ----------------------------------------------------------------------------- (a) plain prefix hit


def scenario_plain_prefix_hit() -> Outcome:
    """llama_full: A computes 40 tokens; B shares A's first 2 blocks; C repeats B's 50 tokens."""
    m = CacheManager(llama(), ManagerConfig(default_pool_pages=16, key_seed=1))
    out = Outcome(m)
    a = np.arange(100, 140, dtype=np.int64)
    _, out.hits["A"], (out.allocs["A"],) = compute(m, a)
    b = np.concatenate([a[:32], fresh(18)])
    out.rids["B"] = rid = m.add_request(b)
    out.hits["B"] = m.match(rid)
    out.notes["versions at match"] = m.pages("full.compressed_kv", [1, 2]).versions.tolist()
    m.acquire(rid, out.hits["B"])
    out.notes["B acquired"] = m.request_tokens(rid)
    out.notes["B leases"] = m.pages("full.compressed_kv", range(5)).leases.tolist()
    out.notes["B pinned"] = m.pinned(rid)["full.compressed_kv"]
    out.allocs["B"] = kept(m.allocate(rid, 18))
    out.notes["B owned"] = m.owned(rid)["full.compressed_kv"]
    m.commit(rid, 18)
    m.release(rid)
    out.hits["C"] = probe(m, b)
    return out


def test_a_plain_prefix_hit_on_llama_full() -> None:
    out = scenario_plain_prefix_hit()
    m, name = out.m, "full.compressed_kv"
    assert out.hits["A"].tokens == 0 and out.hits["A"].codes == ()
    first = out.allocs["A"]
    assert first.block_tables[name].tolist() == [1, 2, 3]
    assert first.slots[name].tolist() == list(range(16, 56))  # page * 16 + offset, pages 1..3
    assert first.copies == () and first.plan is None and first.tail_pages == {} and first.snapshots == {}

    hit = out.hits["B"]
    assert (hit.tokens, hit.candidate_tokens, hit.codes, hit.partial_copy) == (32, 32, ("LCM_BOUNDARY",), False)
    assert hit.block_ids.tolist() == [0, 1]
    assert {k: v.tolist() for k, v in hit.pages.items()} == {name: [1, 2]}
    assert {k: v.tolist() for k, v in hit.versions.items()} == {name: out.notes["versions at match"]}
    assert out.notes["B acquired"] == (32, 32, 50)
    assert out.notes["B leases"] == [0, 1, 1, 0, 0]  # the hit's pages are pinned once each
    assert out.notes["B pinned"] == dict(zip([1, 2], out.notes["versions at match"], strict=True))
    alloc = out.allocs["B"]
    assert (alloc.start_tokens, alloc.num_tokens) == (32, 18)
    assert alloc.block_tables[name].tolist() == [1, 2, 3, 4]  # page 3 came back to the free list
    assert alloc.slots[name].tolist() == list(range(48, 66))
    assert alloc.copies == () and alloc.plan is None
    assert out.notes["B owned"] == [3, 4]

    again = out.hits["C"]  # the whole 50-token prompt is cached up to 48: at least one token computes
    assert (again.tokens, again.candidate_tokens) == (48, 48)
    assert again.codes == ("PARTIAL_BLOCK", "LCM_BOUNDARY")
    assert again.pages[name].tolist() == [1, 2, 3]
    # block 3 of B (tokens 48..49) never completed: its page is given back, nothing refers to it
    assert states(m, name, [1, 2, 3, 4, 5]) == ["PUBLISHED"] * 3 + ["FREE"] * 2
    assert m.pages(name, [1, 2, 3]).holders.tolist() == [1, 1, 1]
    assert m.index_counts() == {"blocks": 3, "points": 0, "keys": 3}
    assert check_invariants(m) == []


def scenario_max_tokens() -> Outcome:
    """llama_full: A computes 40 tokens; B asks for a hit of at most 20 of the 32 tokens it shares with A."""
    m = CacheManager(llama(), ManagerConfig(default_pool_pages=16, key_seed=1))
    out = Outcome(m)
    a = np.arange(100, 140, dtype=np.int64)
    compute(m, a)
    out.rids["B"] = rid = m.add_request(np.concatenate([a[:32], fresh(18)]))
    out.hits["B"] = m.match(rid, max_tokens=20)
    m.acquire(rid, out.hits["B"])
    out.notes["B acquired"] = m.request_tokens(rid)
    return out


def test_a_hit_bounded_by_max_tokens() -> None:
    out = scenario_max_tokens()
    hit = out.hits["B"]
    assert (hit.tokens, hit.candidate_tokens, hit.codes) == (16, 16, ("MAX_TOKENS", "LCM_BOUNDARY"))
    assert hit.pages["full.compressed_kv"].tolist() == [1]
    assert out.notes["B acquired"] == (16, 16, 50)
    assert check_invariants(out.m) == []


# ----------------------------------------------------------------------------- (b) window slid past


def scenario_window_slid_past() -> Outcome:
    """tiny_v4, points only at prompt ends: 16 (an earlier 17-token request) and 40 (A, 41 tokens).
    B shares A's first 3 blocks: A's window at block 2 slid away and no point is kept at 24."""
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=32, retain_every_blocks=100, key_seed=1))
    out = Outcome(m)
    a = tokens_of(41, seed=2)
    _, _, early = compute(m, a[:17])
    out.rids["A"], out.hits["A"], allocs = compute(m, a, chunk=8)
    out.notes["early windows"] = window_pages(early, 8)
    out.notes["A windows"] = window_pages(allocs, 8)
    out.hits["B"] = probe(m, np.concatenate([a[:24], fresh(9)]))
    out.hits["A+"] = probe(m, np.concatenate([a, fresh(9)]))
    out.notes["blocks"] = block_ids(m, a)
    return out


def test_b_window_slid_past_a_resume_point() -> None:
    out = scenario_window_slid_past()
    m = out.m
    assert all(b >= 0 for b in out.notes["blocks"])  # all 5 blocks of A are indexed
    assert kept_points(m) == [16, 40]
    assert out.hits["A"].tokens == 16  # A resumed at the earlier request's prompt end
    # the point at 16 refers to the early request's block-1 window page, the point at 40 to A's block 4
    # (W = 8: one block); every other window page slid away and was given back
    early, mine = out.notes["early windows"], out.notes["A windows"]
    # the early request gave back pages 1 (slid out at its commit) and 3 (at its release): the most
    # recently freed page is handed out first, so A writes blocks 2..5 into 3, 1, 3, 1 as its window slides
    assert early == [1, 2, 3] and mine == [NULL_PAGE, NULL_PAGE, 3, 1, 3, 1]
    assert point_window_pages(m, out.notes["blocks"][1]) == [2] and point_window_pages(m, out.notes["blocks"][4]) == [3]
    for pool in WINDOWS:  # the window pools share page ids
        assert states(m, pool, [1, 2, 3, 4]) == ["FREE", "PUBLISHED", "PUBLISHED", "FREE"]
        assert m.pages(pool, [2, 3]).holders.tolist() == [1, 1]
    hit = out.hits["B"]
    assert (hit.tokens, hit.candidate_tokens) == (16, 24)
    assert hit.codes == ("WINDOW_MISSING", "TAIL_MISSING", "INDEXER_MISSING", "LCM_BOUNDARY")
    details = {r.code: r.detail for r in hit.reasons}
    # one condition per page pool: the three windows are one page pool
    assert details["WINDOW_MISSING"] == "swa.swa_window+csa.swa_window+hca.swa_window: usable to block 2 < 3"
    assert details["TAIL_MISSING"] == "csa.compressor_tail+hca.compressor_tail: usable to block 2 < 3"
    assert details["INDEXER_MISSING"] == "csa.indexer_state.tail: usable to block 2 < 3"
    assert hit.pages["swa.swa_window"].tolist() == [2]
    assert out.hits["A+"].tokens == 40 and out.hits["A+"].codes == ("LCM_BOUNDARY",)
    assert out.hits["A+"].pages["hca.swa_window"].tolist() == [3]
    assert check_invariants(m) == []


# ----------------------------------------------------------------------------- (c) (d) LCM and CoW


def scenario_flash_page_rules(partial: bool) -> Outcome:
    """flash (16-token blocks): A computes 1600 tokens (points every 4 blocks); B shares 1280 of them."""
    m = CacheManager(flash16(), ManagerConfig(default_pool_pages=256, retain_every_blocks=4,
                                              allow_partial_page_copy=partial, key_seed=1))
    out = Outcome(m)
    a = tokens_of(1600)
    _, _, (out.allocs["A"],) = compute(m, a)
    out.notes["points"] = kept_points(m)
    rid = out.rids["B"] = m.add_request(np.concatenate([a[:1280], fresh(20)]))
    out.hits["B"] = m.match(rid)
    m.acquire(rid, out.hits["B"])
    out.notes["versions"] = {name: m.pages(name, out.hits["B"].pages[name]).versions.tolist()
                             for name in out.hits["B"].pages}
    alloc = m.allocate(rid, 20)
    out.allocs["B"] = kept(alloc)
    out.notes["hca states"] = states(m, "hca.compressed_kv", [1, 2, 3, 4, 5])
    out.notes["hca leases"] = m.pages("hca.compressed_kv", [1, 2, 3, 4, 5]).leases.tolist()
    if alloc.plan is not None:  # commit waits for the copies
        with pytest.raises(InvalidRequestState) as err:
            m.commit(rid, 20)
        out.notes["commit in flight"] = err.value.reason
    run_copies(m, alloc)
    out.notes["hca states after copies"] = states(m, "hca.compressed_kv", [1, 2, 3, 4, 5])
    m.commit(rid, 20)
    out.notes["invariants"] = check_invariants(m)
    m.release(rid)
    return out


def scenario_lcm_rounded() -> Outcome:
    return scenario_flash_page_rules(partial=False)


def scenario_partial_page_copy() -> Outcome:
    return scenario_flash_page_rules(partial=True)


def test_c_lcm_rounding_without_partial_page_copy() -> None:
    out = scenario_lcm_rounded()
    assert out.m.core.lcm_tokens == 512
    assert out.notes["points"] == [512, 1024, 1536]  # only points a hit can use (LCM multiples)
    assert out.allocs["A"].block_tables["hca.compressed_kv"].tolist() == [1, 2, 3, 4]
    hit = out.hits["B"]
    assert (hit.tokens, hit.candidate_tokens, hit.partial_copy) == (1024, 1280, False)
    assert hit.tokens % 512 == 0
    # no point is kept at 1280 (not a multiple of 512): the windows and tails there are not retained either
    assert hit.codes == ("LCM_ROUNDED", "WINDOW_MISSING", "TAIL_MISSING", "INDEXER_MISSING", "LCM_BOUNDARY")
    assert hit.reasons[0].layer == "whole_block" and hit.reasons[0].detail == "lcm=512: usable to block 64 < 80"
    assert hit.pages["hca.compressed_kv"].tolist() == [1, 2]  # whole pages, shared without copies
    alloc = out.allocs["B"]
    # A's last page [1536, 2048) held no entry (the first is written at 1663): given back at release
    assert alloc.block_tables["hca.compressed_kv"].tolist() == [1, 2, 4]
    assert out.notes["hca states"] == ["PUBLISHED"] * 3 + ["RESERVED", "FREE"]
    assert out.notes["hca leases"] == [1, 1, 0, 0, 0]
    # only the tails with rows at P are seeded (the HCA tail is empty at a multiple of 128)
    assert [c.pool for c in alloc.copies] == ["csa.compressor_tail", "csa.indexer_state.tail"]
    assert [c.entries for c in alloc.copies] == [4, 4]  # 4 overlap rows each
    assert out.notes["commit in flight"].startswith("copy plans [")
    assert out.notes["invariants"] == []


def test_d_partial_page_copy_copies_the_shared_hca_page() -> None:
    out = scenario_partial_page_copy()
    hit = out.hits["B"]
    assert (hit.tokens, hit.candidate_tokens, hit.partial_copy) == (1280, 1280, True)
    assert hit.codes == ("PARTIAL_PAGE_COPY",)
    assert hit.pages["hca.compressed_kv"].tolist() == [1, 2, 3]
    snapshot = int(hit.pages["csa.compressor_tail"][0])
    assert snapshot == 21  # A's working tail page is 1, then one snapshot page per 64 tokens: 1280 -> 21
    assert hit.pages["hca.compressor_tail"].tolist() == [21]  # the compressor tails share one page pool
    assert {k: v.tolist() for k, v in hit.versions.items()} == out.notes["versions"]
    alloc = out.allocs["B"]
    tail_version = out.notes["versions"]["csa.compressor_tail"][0]
    indexer_version = out.notes["versions"]["csa.indexer_state.tail"][0]
    hca_version = out.notes["versions"]["hca.compressed_kv"][2]
    assert alloc.copies == (
        CopyPages(pool="hca.compressed_kv", src=3, dst=4, entries=2, src_version=hca_version),  # (1280-1024)/128
        CopyPages(pool="csa.compressor_tail", src=21, dst=1, entries=4, src_version=tail_version),
        CopyPages(pool="csa.indexer_state.tail", src=21, dst=1, entries=4, src_version=indexer_version),
    )  # no hca.compressor_tail copy: 1280 % 128 == 0 rows to seed
    assert alloc.plan is not None and alloc.plan.request_id == out.rids["B"]
    assert alloc.block_tables["hca.compressed_kv"].tolist() == [1, 2, 4]  # page 3 replaced by its copy
    # 1280 is aligned to the 16-token csa pages: the 80 shared pages are read in place, 2 new ones follow
    assert alloc.block_tables["csa.compressed_kv"].tolist() == [*range(1, 81), 101, 102]
    assert alloc.tail_pages == {"csa.compressor_tail": 1, "csa.indexer_state.tail": 1, "hca.compressor_tail": 1}
    assert out.notes["hca states"] == ["PUBLISHED"] * 3 + ["FILLING", "FREE"]  # the copy's target until complete
    assert out.notes["hca states after copies"] == ["PUBLISHED"] * 3 + ["RESERVED", "FREE"]
    assert out.notes["hca leases"] == [1, 1, 1, 0, 0]  # the shared source stays pinned, the copy is owned
    assert out.notes["commit in flight"].startswith("copy plans [")
    assert out.notes["invariants"] == []


# ----------------------------------------------------------------------------- (e) isolation


def scenario_isolation() -> Outcome:
    """tiny_v4: A computes 33 tokens with salt 'tenant-a' and LoRA 1; probes vary the extras."""
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=32, retain_every_blocks=2, key_seed=1))
    out = Outcome(m)
    a = tokens_of(33, seed=3)
    compute(m, a, cache_salt="tenant-a", lora_id=1)
    probe_tokens = np.concatenate([a, fresh(9)])
    extras: dict[str, dict[str, Any]] = {"same": {"cache_salt": "tenant-a", "lora_id": 1},
                                         "other salt": {"cache_salt": "tenant-b", "lora_id": 1},
                                         "no salt": {"lora_id": 1},
                                         "other lora": {"cache_salt": "tenant-a", "lora_id": 2},
                                         "lora as str": {"cache_salt": "tenant-a", "lora_id": "1"},
                                         "no lora": {"cache_salt": "tenant-a"}}
    for name, extra in extras.items():
        out.hits[name] = probe(m, probe_tokens, **extra)
    return out


def test_e_salt_and_lora_isolation() -> None:
    out = scenario_isolation()
    assert out.hits["same"].tokens == 32 and out.hits["same"].codes == ("LCM_BOUNDARY",)
    for name in ("other salt", "no salt", "other lora", "lora as str", "no lora"):
        hit = out.hits[name]
        assert (hit.tokens, hit.candidate_tokens, hit.codes, hit.block_ids.size) == (0, 0, (), 0), name
    assert check_invariants(out.m) == []


# ----------------------------------------------------------------------------- (f) failed allocation


def test_f_failed_allocation_changes_nothing_llama() -> None:
    m = CacheManager(llama(), ManagerConfig(default_pool_pages=4, key_seed=1))
    rid = m.add_request(np.arange(100, dtype=np.int64))
    before = m.snapshot()
    with pytest.raises(OutOfPages) as err:
        m.allocate(rid, 80)
    assert (err.value.pool, err.value.needed, err.value.free) == ("full.compressed_kv", 5, 4)
    assert err.value.fields["pool"] == "full.compressed_kv"
    assert m.request_tokens(rid) == (0, 0, 100)
    assert m.free_pages("full.compressed_kv") == 4
    assert m.snapshot() == before
    assert check_invariants(m) == []
    alloc = m.allocate(rid, 64)  # what does fit still works: nothing leaked
    assert alloc.block_tables["full.compressed_kv"].tolist() == [1, 2, 3, 4]
    assert m.owned(rid)["full.compressed_kv"] == [1, 2, 3, 4]
    assert check_invariants(m) == []


def scenario_failed_allocation_with_hit() -> Outcome:
    """tiny_v4, hca.compressed_kv has 6 pages.  A (33 tokens) is cached; B resumes at 16 from it and
    asks for 40 more tokens: 5 hca pages, but only 2 are free and 2 more could be evicted."""
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=32, pool_pages={"hca.compressed_kv": 6},
                                           retain_every_blocks=2, evict_slack_shift=None, key_seed=1))
    out = Outcome(m)
    a = tokens_of(33, seed=4)
    compute(m, a)
    rid = out.rids["B"] = m.add_request(np.concatenate([a[:16], fresh(40)]))
    out.hits["B"] = m.match(rid)
    m.acquire(rid, out.hits["B"])
    out.notes["before"] = m.snapshot()
    out.notes["free"] = [m.free_pages(p.name) for p in m.layout.pools]
    try:
        m.allocate(rid, 40)
    except OutOfPages as err:
        out.notes["error"] = err
    out.notes["after"] = m.snapshot()
    return out


def test_f_failed_allocation_changes_nothing_with_a_hit_and_evictable_pages() -> None:
    out = scenario_failed_allocation_with_hit()
    m = out.m
    assert out.hits["B"].tokens == 16
    err = out.notes["error"]
    assert isinstance(err, OutOfPages)
    assert (err.pool, err.needed, err.free) == ("hca.compressed_kv", 5, 2)
    assert m.request_tokens(out.rids["B"]) == (16, 16, 56)
    assert [m.free_pages(p.name) for p in m.layout.pools] == out.notes["free"]
    assert out.notes["after"] == out.notes["before"]  # no eviction, no pin, no page moved (F8)
    assert check_invariants(m) == []
    assert m.allocate(out.rids["B"], 8).block_tables["hca.compressed_kv"].tolist() == [1, 2, 5]


def test_f_allocation_evicts_a_cold_chain_when_that_is_enough() -> None:
    m = CacheManager(llama(), ManagerConfig(default_pool_pages=8, evict_slack_shift=None, key_seed=1))
    a = np.arange(64, dtype=np.int64)
    compute(m, a)  # 4 cached pages, nothing pinned
    rid = m.add_request(fresh(96))  # 6 pages: 4 free + 2 from evicting A's last two blocks
    alloc = m.allocate(rid, 96)
    assert alloc.block_tables["full.compressed_kv"].tolist() == [3, 4, 5, 6, 7, 8]
    assert m.stats["evicted_blocks"] == 2 and m.stats["evictions"] == 1
    assert probe(m, np.concatenate([a, fresh(17)])).tokens == 32  # A's head survives (LRU: tail first)
    assert check_invariants(m) == []


def test_f_eviction_for_an_allocation_frees_a_low_water_margin() -> None:
    """The default slack: an allocation short of pages evicts `pages >> 6` more than it needs."""
    m = CacheManager(llama(), ManagerConfig(default_pool_pages=128, key_seed=1))
    a = np.arange(64 * 16, dtype=np.int64)
    compute(m, a)  # 64 cached pages
    rid = m.add_request(fresh(66 * 16))  # 66 pages: 64 free + 2 evicted, + 128 >> 6 = 2 of margin
    m.allocate(rid, 66 * 16)
    assert m.stats["evicted_blocks"] == 4 and m.free_pages("full.compressed_kv") == 2
    assert alive_positions(m, a) == 60
    assert check_invariants(m) == []


# ----------------------------------------------------------------------------- (g) stale lease


def scenario_stale_lease() -> Outcome:
    """tiny_v4: A (41 tokens) is cached; B matches 40 tokens, then everything is evicted."""
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=32, retain_every_blocks=2, key_seed=1))
    out = Outcome(m)
    a = tokens_of(41, seed=5)
    compute(m, a)
    out.notes["points"] = kept_points(m)
    rid = out.rids["B"] = m.add_request(np.concatenate([a, fresh(1)]))
    out.hits["B"] = m.match(rid)
    out.notes["evicted"] = m.evict()
    out.notes["stats"] = m.stats
    with pytest.raises(StaleLease) as err:
        m.acquire(rid, out.hits["B"])
    out.notes["error"] = err.value
    out.hits["B again"] = m.match(rid)
    return out


def test_g_lease_invalidated_by_eviction() -> None:
    out = scenario_stale_lease()
    m, rid = out.m, out.rids["B"]
    hit = out.hits["B"]
    assert out.notes["points"] == [16, 32, 40]
    assert hit.tokens == 40 and hit.codes == ("PARTIAL_BLOCK", "LCM_BOUNDARY")
    assert hit.pages["swa.swa_window"].tolist() == [5]  # block 4's window page, held by the point at 40
    # 8 units in LRU order, deepest first, a block's point before the block: point 40, block 4,
    # point 32, block 3, block 2, point 16, block 1, block 0
    assert out.notes["evicted"] == 8
    assert (out.notes["stats"]["evicted_points"], out.notes["stats"]["evicted_blocks"]) == (3, 5)
    err = out.notes["error"]
    # acquire checks the hit's blocks first: block 0 left the index (its row is free, its version moved)
    assert (err.pool, err.page, err.expected_version, err.request_id) == (
        "block", int(hit.block_ids[0]), int(hit.block_versions[0]), rid)
    assert err.found_version != err.expected_version
    assert (err.fields["expected_state"], err.fields["found_state"]) == ("INDEXED", "FREE")
    assert all(int(m.pages(p.name).leases.sum()) == 0 for p in m.layout.pools)
    assert all(not pages for pages in m.pinned(rid).values())
    assert m.chain(rid) == []
    assert m.request_tokens(rid) == (0, 0, 42)
    assert m.index_counts() == {"blocks": 0, "points": 0, "keys": 0}
    assert all(m.free_pages(p.name) == 32 for p in m.layout.pools)  # everything went back
    assert out.hits["B again"].tokens == 0 and out.hits["B again"].codes == ()
    assert check_invariants(m) == []


def test_g_a_point_dropped_after_match_is_a_stale_lease() -> None:
    """Only the point at 40 goes (one unit): the blocks are intact, acquire refuses the point."""
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=32, retain_every_blocks=2, key_seed=1))
    a = tokens_of(41, seed=5)
    compute(m, a)
    rid = m.add_request(np.concatenate([a, fresh(1)]))
    hit = m.match(rid)
    assert m.evict(max_units=1) == 1 and m.stats["evicted_points"] == 1
    before = m.snapshot()
    with pytest.raises(StaleLease) as err:
        m.acquire(rid, hit)
    assert (err.value.pool, err.value.page, err.value.expected_version) == ("resume_point", hit.point,
                                                                            hit.point_version)
    assert (err.value.fields["expected_state"], err.value.fields["found_state"]) == ("KEPT", "FREE")
    assert m.snapshot() == before
    assert m.match(rid).tokens == 32
    assert check_invariants(m) == []


# ----------------------------------------------------------------------------- (h) reason codes


def scenario_abi_mismatch() -> Outcome:
    layout = tiny()
    accepted = frozenset(p.abi_id for p in layout.pools if p.name != "hca.compressed_kv")
    m = CacheManager(layout, ManagerConfig(default_pool_pages=32, retain_every_blocks=2, accepted_abi=accepted,
                                           key_seed=1))
    out = Outcome(m)
    a = tokens_of(33, seed=6)
    compute(m, a)
    out.hits["probe"] = probe(m, np.concatenate([a, fresh(9)]))
    return out


def scenario_misaligned_page() -> Outcome:
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=32, retain_every_blocks=2,
                                           device_alignment_bytes=8192, key_seed=1))
    out = Outcome(m)
    a = tokens_of(33, seed=6)
    compute(m, a)
    out.hits["probe"] = probe(m, np.concatenate([a, fresh(9)]))
    return out


def scenario_partial_block() -> Outcome:
    """llama_full: A computes 48 tokens; probes end exactly on, and inside, A's last block."""
    m = CacheManager(llama(), ManagerConfig(default_pool_pages=16, key_seed=1))
    out = Outcome(m)
    a = tokens_of(48, seed=7)
    compute(m, a)
    out.hits["whole prompt cached"] = probe(m, a)
    out.hits["ends inside a block"] = probe(m, a[:40])
    out.hits["one more block"] = probe(m, np.concatenate([a, fresh(17)]))
    return out


def scenario_flash_missing(computed: int, shared: int, *, release: bool) -> Outcome:
    """flash: A computes `computed` tokens (points every 4 blocks); the probe shares `shared` of them.

    With `release=False` A is still running: the prefix page it is writing is its own (unpublished),
    while its blocks and points are in the index since their commit.
    """
    m = CacheManager(flash16(), ManagerConfig(default_pool_pages=256, retain_every_blocks=4, key_seed=1))
    out = Outcome(m)
    a = tokens_of(1600, seed=8)
    out.rids["A"], _, _ = compute(m, a[:computed], release=release)
    out.hits["probe"] = probe(m, np.concatenate([a[:shared], fresh(17)]))
    out.notes["a"] = a
    return out


def scenario_compressed_missing() -> Outcome:
    return scenario_flash_missing(computed=700, shared=688, release=False)


def scenario_indexer_missing() -> Outcome:
    return scenario_flash_missing(computed=1552, shared=1552, release=False)


def scenario_tail_missing() -> Outcome:
    return scenario_flash_missing(computed=600, shared=112, release=True)


def test_h_abi_mismatch_rejects_the_hit() -> None:
    hit = scenario_abi_mismatch().hits["probe"]
    assert (hit.tokens, hit.candidate_tokens, hit.pages, hit.block_ids.size) == (0, 32, {}, 0)
    assert hit.codes == ("ABI_MISMATCH",)
    assert hit.reasons[0].layer == "kernel_abi" and hit.reasons[0].detail.startswith("hca.compressed_kv: ")


def test_h_misaligned_pages_reject_the_hit() -> None:
    out = scenario_misaligned_page()
    hit = out.hits["probe"]
    assert all(p.page_bytes < 8192 for p in out.m.layout.pools)
    assert (hit.tokens, hit.candidate_tokens, hit.pages) == (0, 32, {})
    assert hit.codes == ("MISALIGNED_PAGE",) * len(out.m.layout.pools)  # one per pool, each misaligned
    assert {r.layer for r in hit.reasons} == {"byte_alignment"}
    assert "swa.swa_window: 512 bytes per page, alignment 8192" in [r.detail for r in hit.reasons]


def test_h_partial_block() -> None:
    out = scenario_partial_block()
    whole, inside, more = (out.hits[k] for k in ("whole prompt cached", "ends inside a block", "one more block"))
    assert (whole.tokens, whole.candidate_tokens, whole.codes) == (32, 32, ("PARTIAL_BLOCK", "LCM_BOUNDARY"))
    assert (inside.tokens, inside.candidate_tokens, inside.codes) == (32, 32, ("PARTIAL_BLOCK", "LCM_BOUNDARY"))
    assert (more.tokens, more.codes) == (48, ("LCM_BOUNDARY",))


def hca_objects(m: CacheManager, ids: list[int], pool: str = "hca.compressed_kv") -> list[int]:
    """The page each block refers to in prefix pool `pool` (NULL_PAGE where none)."""
    blocks, o = m.core.index.blocks, m.core.objects
    col = next(c for c, (p, _) in enumerate(blocks.refs) if pool in p.spec.member_names)
    return [int(o.slot[x]) if x else NULL_PAGE for x in blocks.objects(np.array(ids), col).tolist()]


def test_h_compressed_missing_mid_hca_page() -> None:
    """A (still running) is at 700, inside the HCA page [512, 1024) (entry 4 done at 639, the page not
    complete, so not published) and the indexer page [640, 704).  A resume at 688 needs HCA entries
    0..4, so page 1: missing.  Only entries j < P // 128 are read, so P <= 624 needs page 0 alone; the
    nearest point is 576."""
    out = scenario_compressed_missing()
    hit, m = out.hits["probe"], out.m
    assert (hit.tokens, hit.candidate_tokens) == (576, 688)
    # then no point at 624: the windows and tails fall back to the point at 576
    assert hit.codes == ("INDEXER_MISSING", "COMPRESSED_MISSING", "WINDOW_MISSING", "TAIL_MISSING", "LCM_BOUNDARY")
    details = dict((r.code, r.detail) for r in hit.reasons)
    assert details["COMPRESSED_MISSING"] == "hca.compressed_kv: usable to block 39 < 43"
    assert details["INDEXER_MISSING"].startswith("csa.indexer_state.keys: usable to block 40 < 43")
    ids = block_ids(m, out.notes["a"][:688])
    assert all(i >= 0 for i in ids)
    assert hca_objects(m, ids[32:]) == [NULL_PAGE] * 11
    assert hca_objects(m, ids[:32]) == [1] * 32
    assert m.owned(out.rids["A"])["hca.compressed_kv"] == [2]  # the page A is writing is still its own


def test_h_compressed_page_sealed_at_release() -> None:
    """The same history, but A ends at 700: the page it stopped in is sealed and published with the
    entries it holds, referred to by A's blocks 32..42, so the probe resumes at A's prompt end (688),
    copying the shared HCA page on write."""
    out = scenario_flash_missing(computed=700, shared=688, release=True)
    hit, m = out.hits["probe"], out.m
    assert (hit.tokens, hit.candidate_tokens, hit.partial_copy) == (688, 688, True)
    assert hit.codes == ("PARTIAL_PAGE_COPY",)
    ids = block_ids(m, out.notes["a"][:688])
    assert hca_objects(m, ids) == [1] * 32 + [2] * 11
    assert states(m, "hca.compressed_kv", [1, 2]) == ["PUBLISHED", "PUBLISHED"]
    assert m.pages("hca.compressed_kv", [1, 2]).holders.tolist() == [32, 11]
    assert hit.pages["hca.compressed_kv"].tolist() == [1, 2]
    assert check_invariants(m) == []


def test_h_indexer_missing_mid_indexer_page() -> None:
    """A (still running) is at 1552, inside the indexer page [1536, 1600) (and the HCA page [1536, 2048))."""
    out = scenario_indexer_missing()
    hit, m = out.hits["probe"], out.m
    assert (hit.tokens, hit.candidate_tokens) == (1536, 1552)
    # HCA entries j < 12 fill pages 0..2 exactly: the open HCA page [1536, 2048) is not read
    assert hit.codes == ("INDEXER_MISSING", "LCM_BOUNDARY")
    assert dict((r.code, r.detail) for r in hit.reasons)["INDEXER_MISSING"] == (
        "csa.indexer_state.keys: usable to block 96 < 97")
    ids = block_ids(m, out.notes["a"][:1552])
    pages = hca_objects(m, ids[95:97], "csa.indexer_state.keys")
    assert pages[0] != NULL_PAGE and pages[1] == NULL_PAGE


def test_h_tail_and_window_missing_between_points() -> None:
    """The probe shares 112 tokens; points are kept every 64 tokens (4 blocks): no point at 112, so
    neither the window rows nor the tail snapshots at 112 are retained (a point owns both): the hit
    falls back to the point at 64."""
    hit = scenario_tail_missing().hits["probe"]
    assert (hit.tokens, hit.candidate_tokens, hit.partial_copy) == (64, 112, False)
    assert hit.codes == ("WINDOW_MISSING", "TAIL_MISSING", "INDEXER_MISSING", "LCM_BOUNDARY")  # no HCA entry < 64
    details = dict((r.code, r.detail) for r in hit.reasons)
    assert details["TAIL_MISSING"] == "csa.compressor_tail+hca.compressor_tail: usable to block 4 < 7"
    assert details["WINDOW_MISSING"] == "swa.swa_window+csa.swa_window+hca.swa_window: usable to block 4 < 7"
    assert details["INDEXER_MISSING"] == "csa.indexer_state.tail: usable to block 4 < 7"


# ----------------------------------------------------------------------------- (i) eviction order


def scenario_eviction_order() -> Outcome:
    """tiny_v4, points every 2 blocks.  A (33 tokens: blocks 0..3, points 16 and 32) is older than
    B (17 tokens: blocks 0..1, point 16).  Evict one unit at a time."""
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=32, retain_every_blocks=2, evict_slack_shift=None,
                                           key_seed=1))
    out = Outcome(m)
    a, b = tokens_of(33, seed=9), tokens_of(17, seed=10)
    _, _, a_allocs = compute(m, a)
    compute(m, b)
    out.notes["a"], out.notes["b"] = a, b
    out.notes["window pages"] = window_pages(a_allocs, 8)
    a_ids, b_ids = block_ids(m, a), block_ids(m, b)
    out.notes["point windows"] = [point_window_pages(m, a_ids[1]), point_window_pages(m, a_ids[3]),
                                  point_window_pages(m, b_ids[1])]
    tracked = [pages[0] for pages in out.notes["point windows"]]
    steps: list[dict[str, Any]] = []
    for _ in range(10):
        evicted = m.evict(max_units=1)
        steps.append({
            "evicted": evicted,
            "a blocks": alive_positions(m, a),
            "b blocks": alive_positions(m, b),
            "a hit": probe(m, np.concatenate([a, fresh(9)])),
            "b hit": probe(m, np.concatenate([b, fresh(9)])),
            "window states": states(m, "swa.swa_window", tracked),
            "stats": m.stats,
            "counts": m.index_counts(),
        })
    out.notes["steps"] = steps
    for i, step in enumerate(steps):
        out.hits[f"a{i}"], out.hits[f"b{i}"] = step["a hit"], step["b hit"]
    return out


def test_i_dependency_aware_lru_eviction_order() -> None:
    out = scenario_eviction_order()
    assert out.notes["window pages"] == [1, 2, 3, 4, 5]  # A's window page per block
    # W = 8 (one block): A's points at 16, 32 hold its blocks 1 and 3's pages; B's point at 16 holds
    # its block 1's page (B reused the pages A gave back: 1 for its block 1 after 5 for block 0)
    assert out.notes["point windows"] == [[2], [4], [1]]
    s = out.notes["steps"]
    # 1: the deepest unit of A (oldest): its point at 32 (a point goes before its block) with the window
    # page it held; the blocks stay
    assert (s[0]["evicted"], s[0]["a blocks"], s[0]["b blocks"]) == (1, 4, 2)
    assert s[0]["window states"] == ["PUBLISHED", "FREE", "PUBLISHED"]
    assert (s[0]["a hit"].tokens, s[0]["a hit"].candidate_tokens, s[0]["b hit"].tokens) == (16, 32, 16)
    assert s[0]["a hit"].codes == ("WINDOW_MISSING", "TAIL_MISSING", "INDEXER_MISSING", "LCM_BOUNDARY")
    assert (s[0]["stats"]["evicted_points"], s[0]["stats"]["evicted_blocks"]) == (1, 0)
    # 2, 3: A's blocks 3 and 2, leaves without points; A's point at 16 and its window page survive
    assert [(x["a blocks"], x["b blocks"], x["a hit"].tokens) for x in s[1:3]] == [(3, 2, 16), (2, 2, 16)]
    assert all(x["window states"] == s[0]["window states"] for x in s[1:3])
    assert (s[2]["stats"]["evicted_points"], s[2]["stats"]["evicted_blocks"]) == (1, 2)
    # 4: A's point at 16: now its window page goes, and A hits nothing; B's own point at 16 stays
    assert (s[3]["a blocks"], s[3]["b blocks"], s[3]["a hit"].tokens, s[3]["b hit"].tokens) == (2, 2, 0, 16)
    assert s[3]["window states"] == ["FREE", "FREE", "PUBLISHED"]
    # 5, 6: A's blocks 1 and 0; 7: B's point at 16; 8, 9: B's blocks 1 and 0; 10: nothing is left
    assert [(x["a blocks"], x["b blocks"]) for x in s[4:]] == [(1, 2), (0, 2), (0, 2), (0, 1), (0, 0), (0, 0)]
    assert [x["evicted"] for x in s] == [1] * 9 + [0]
    assert (s[5]["b hit"].tokens, s[6]["b hit"].tokens) == (16, 0)
    assert s[5]["window states"] == s[3]["window states"] and s[6]["window states"] == ["FREE"] * 3
    assert [x["counts"]["points"] for x in s] == [2, 2, 2, 1, 1, 1, 0, 0, 0, 0]
    assert (s[8]["stats"]["evicted_points"], s[8]["stats"]["evicted_blocks"]) == (3, 6)
    assert check_invariants(out.m) == []


def scenario_shared_window_pages() -> Outcome:
    """flash (W = 128 tokens = 8 blocks), points every 4 blocks: A computes 520 tokens (blocks 0..31,
    points at 64, 128, ..., 512).  The point at 64k refers to the window pages of blocks 4k-8 .. 4k-1,
    so each window page is shared by the two points whose windows overlap it."""
    m = CacheManager(flash16(), ManagerConfig(default_pool_pages=64, retain_every_blocks=4, key_seed=1))
    out = Outcome(m)
    a = tokens_of(520, seed=14)
    _, _, allocs = compute(m, a)
    out.notes["pages"] = pages = window_pages(allocs, 16, "hca.swa_window")[:32]

    def look() -> dict[str, Any]:
        view = m.pages("hca.swa_window", pages)
        return {"holders": view.holders.tolist(), "states": list(view.states), "blocks": alive_positions(m, a),
                "hit": probe(m, np.concatenate([a[:512], fresh(17)])), "points": kept_points(m)}

    out.notes["steps"] = [look()]
    for _ in range(7):
        m.evict(max_units=1)
        out.notes["steps"].append(look())
    for i, step in enumerate(out.notes["steps"]):
        out.hits[f"step {i}"] = step["hit"]
    return out


def test_i_window_pages_live_while_a_point_needs_them() -> None:
    out = scenario_shared_window_pages()
    s = out.notes["steps"]
    assert out.notes["pages"] == list(range(1, 33))  # one window page per block, in block order
    assert s[0]["points"] == list(range(64, 513, 64))
    assert s[0]["holders"] == [2] * 28 + [1] * 4  # blocks 28..31 are only in the window of the point at 512
    assert (s[0]["blocks"], s[0]["hit"].tokens) == (32, 512)
    # 1: the point at 512 goes: blocks 28..31's pages are freed, 24..27 keep the point at 448
    assert s[1]["holders"] == [2] * 24 + [1] * 4 + [0] * 4
    assert s[1]["states"] == ["PUBLISHED"] * 28 + ["FREE"] * 4
    assert (s[1]["blocks"], s[1]["hit"].tokens, s[1]["hit"].candidate_tokens) == (32, 448, 512)
    assert s[1]["hit"].codes == ("WINDOW_MISSING", "TAIL_MISSING", "INDEXER_MISSING", "PARTIAL_PAGE_COPY")
    # 2..5: the leaf blocks 31, 30, 29, 28 (no point, no window page) go one by one
    assert [x["blocks"] for x in s[2:6]] == [31, 30, 29, 28]
    assert all(x["holders"] == s[1]["holders"] and x["hit"].tokens == 448 for x in s[2:6])
    assert s[5]["hit"].candidate_tokens == 448
    # 6: the point at 448: blocks 24..27's pages are freed, 20..23 are still held by 384
    assert s[6]["holders"] == [2] * 20 + [1] * 4 + [0] * 8
    assert s[6]["states"] == ["PUBLISHED"] * 24 + ["FREE"] * 8
    assert (s[6]["blocks"], s[6]["hit"].tokens) == (28, 384)
    # 7: block 27
    assert (s[7]["blocks"], s[7]["hit"].tokens, s[7]["points"]) == (27, 384, list(range(64, 385, 64)))
    assert check_invariants(out.m) == []


def test_i_pinned_hit_survives_evict_all() -> None:
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=32, retain_every_blocks=2, key_seed=1))
    a = tokens_of(33, seed=11)
    compute(m, a)
    rid = m.add_request(np.concatenate([a[:16], fresh(9)]))
    hit = m.match(rid)
    m.acquire(rid, hit)
    m.evict()
    assert alive_positions(m, a) == 2  # blocks 0, 1 and the point at 16 are pinned by the lease
    assert kept_points(m) == [16]
    assert probe(m, np.concatenate([a, fresh(9)])).tokens == 16
    m.release(rid)
    m.evict()
    assert alive_positions(m, a) == 0
    assert m.index_counts() == {"blocks": 0, "points": 0, "keys": 0}
    assert check_invariants(m) == []


def test_i_evict_several_units_is_still_lru() -> None:
    m = CacheManager(llama(), ManagerConfig(default_pool_pages=32, key_seed=1))
    a, b = tokens_of(64, seed=12), tokens_of(32, seed=13)
    compute(m, a)  # older: 4 blocks
    compute(m, b)  # newer: 2 blocks
    assert m.evict(max_units=2) == 2
    # LRU: A's blocks 3 and 2 (both older than anything of B) go; B stays whole
    assert (alive_positions(m, a), alive_positions(m, b)) == (2, 2)


# ----------------------------------------------------------------------------- (k) new behaviour


def scenario_prompt_end_inside_a_page() -> Outcome:
    """V4-Flash block 16: a 300-token prompt, then a follow-up extending it by 40 tokens."""
    m = CacheManager(flash16(), ManagerConfig(key_seed=0))
    out = Outcome(m)
    prompt = np.arange(300, dtype=np.int64)
    rid, out.hits["first"], (first,) = compute(m, prompt)
    out.allocs["first"] = first
    out.notes["points"] = kept_points(m)
    out.notes["hca after release"] = (states(m, "hca.compressed_kv", [1]), m.pages("hca.compressed_kv", [1]))
    rid = out.rids["follow-up"] = m.add_request(np.concatenate([prompt, np.arange(1000, 1040)]))
    hit = out.hits["follow-up"] = m.match(rid)
    assert hit.tokens == brute_force_hit_tokens(m, rid)
    m.acquire(rid, hit)
    alloc = m.allocate(rid, 340 - hit.tokens)
    out.allocs["follow-up"] = kept(alloc)
    out.notes["hca during copy"] = states(m, "hca.compressed_kv", [1, 2])
    run_copies(m, alloc)
    m.commit(rid, 340 - hit.tokens)
    m.release(rid)
    out.hits["again"] = probe(m, np.concatenate([prompt, np.arange(1000, 1040), fresh(3)]))
    return out


def test_k_follow_up_resumes_inside_the_page_the_prompt_stopped_in() -> None:
    out = scenario_prompt_end_inside_a_page()
    m = out.m
    assert out.hits["first"].tokens == 0
    assert out.notes["points"] == [256, 288]  # every 16 blocks, and the prompt end
    (hca_state,), hca = out.notes["hca after release"]
    assert hca_state == "PUBLISHED"  # the HCA page [0, 512) the prompt stopped in was sealed at release
    assert hca.holders.tolist() == [18]  # referred to by the 18 complete blocks
    hit = out.hits["follow-up"]
    assert (hit.tokens, hit.candidate_tokens, hit.partial_copy) == (288, 288, True)
    assert hit.codes == ("PARTIAL_PAGE_COPY",)
    assert hit.pages["hca.compressed_kv"].tolist() == [1]
    alloc = out.allocs["follow-up"]
    versions = {k: int(v[-1]) for k, v in hit.versions.items()}
    indexer_page = int(hit.pages["csa.indexer_state.keys"][-1])
    tail = int(hit.pages["csa.compressor_tail"][0])
    assert alloc.plan is not None and alloc.copies == (
        # the shared pages that 288 splits: copied on write into the request's own page
        CopyPages(pool="csa.indexer_state.keys", src=indexer_page, dst=indexer_page + 1, entries=8,
                  src_version=versions["csa.indexer_state.keys"]),  # (288 - 256) / 4
        CopyPages(pool="hca.compressed_kv", src=1, dst=2, entries=2, src_version=versions["hca.compressed_kv"]),
        # the working tails seeded from the snapshots at 288
        CopyPages(pool="csa.compressor_tail", src=tail, dst=1, entries=4, src_version=versions["csa.compressor_tail"]),
        CopyPages(pool="hca.compressor_tail", src=tail, dst=1, entries=32,
                  src_version=versions["hca.compressor_tail"]),
        CopyPages(pool="csa.indexer_state.tail", src=int(hit.pages["csa.indexer_state.tail"][0]), dst=1, entries=4,
                  src_version=versions["csa.indexer_state.tail"]),
    )
    assert out.notes["hca during copy"] == ["PUBLISHED", "FILLING"]
    assert out.hits["again"].tokens == 336  # the follow-up's own prompt end (340 // 16 * 16)
    assert check_invariants(m) == []


def scenario_lcm_points_only() -> Outcome:
    """V4-Flash block 16, no partial-page copy, points every 4 blocks: an 1,100-token prompt."""
    m = CacheManager(flash16(), ManagerConfig(key_seed=0, allow_partial_page_copy=False, retain_every_blocks=4))
    out = Outcome(m)
    prompt = np.arange(1100, dtype=np.int64)
    compute(m, prompt)
    out.notes["counts"] = m.index_counts()
    out.notes["points"] = kept_points(m)
    out.hits["follow-up"] = probe(m, np.concatenate([prompt, fresh(5)]))
    out.hits["shorter"] = probe(m, np.concatenate([prompt[:1000], fresh(5)]))
    return out


def test_k_without_partial_page_copy_only_lcm_points_are_kept() -> None:
    out = scenario_lcm_points_only()
    assert out.m.core.lcm_tokens == 512
    # every 4 blocks would be 17 points (and the prompt end 1088): only the LCM multiples a hit can use
    assert out.notes["counts"]["points"] == 2
    assert out.notes["points"] == [512, 1024]
    assert out.notes["counts"]["blocks"] == 1100 // 16
    assert (out.hits["follow-up"].tokens, out.hits["follow-up"].candidate_tokens) == (1024, 1088)
    assert out.hits["follow-up"].codes == ("LCM_ROUNDED", "WINDOW_MISSING", "TAIL_MISSING", "INDEXER_MISSING",
                                           "LCM_BOUNDARY")  # no point at the prompt end 1088 either
    assert out.hits["shorter"].tokens == 512
    assert check_invariants(out.m) == []


def scenario_swa_full_match_agrees_with_acquire() -> Outcome:
    """swa_full: 320 then 352 tokens served whole; a 340-token request matches and acquires."""
    m = CacheManager(Layout.from_preset("swa_full"), ManagerConfig(key_seed=0))
    out = Outcome(m)
    base = np.arange(400)
    for end in (320, 352):
        _, out.hits[f"serve {end}"], _ = compute(m, base[:end])
    out.notes["points"] = kept_points(m)
    rid = out.rids["r"] = m.add_request(base[:340])
    hit = out.hits["r"] = m.match(rid)
    out.notes["brute force"] = brute_force_hit_tokens(m, rid)
    m.acquire(rid, hit)  # StaleLease here was the defect: match and acquire disagreed on a resume point
    points = m.core.index.points
    out.notes["point"] = (points.table.states[int(points.state[hit.point])], int(points.block[hit.point]) ==
                          int(hit.block_ids[-1]), boundary_of(m, int(points.block[hit.point])))
    out.notes["pinned"] = m.pinned(rid)
    out.notes["tokens"] = m.request_tokens(rid)
    return out


def test_k_swa_full_a_hit_match_returns_is_acquired() -> None:
    out = scenario_swa_full_match_agrees_with_acquire()
    assert out.hits["serve 320"].tokens == 0 and out.hits["serve 352"].tokens == 320
    assert out.notes["points"] == [256, 320, 352]  # every 16 blocks, and the prompt ends
    hit = out.hits["r"]
    # blocks up to 336 are indexed, but no point is kept at 336: the window rows there are not retained
    assert (hit.tokens, hit.candidate_tokens) == (320, 336)
    assert hit.codes == ("PARTIAL_BLOCK", "WINDOW_MISSING", "LCM_BOUNDARY")
    assert hit.reasons[1].detail == "swa.swa_window: usable to block 20 < 21"
    assert out.notes["brute force"] == 320
    assert out.notes["point"] == ("KEPT", True, 320)
    assert out.notes["tokens"] == (320, 320, 340)
    assert set(out.notes["pinned"]["swa.swa_window"]) == set(hit.pages["swa.swa_window"].tolist())
    assert len(hit.pages["swa.swa_window"]) == 8  # W = 128: the blocks overlapping [193, 320)
    assert check_invariants(out.m) == []


# ----------------------------------------------------------------------------- (j) bad input


def test_j_invalid_tokens_change_nothing() -> None:
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=16, key_seed=1))
    compute(m, tokens_of(20), release=False)
    before = m.snapshot()
    cases: list[tuple[Any, str]] = [
        (np.array([1.0, 2.0]), "dtype"), (np.zeros((2, 8), np.int64), "1-D"), (np.array([1, -1, 3]), "[0, 2**31)"),
        (np.array([[3]], np.int32), "1-D"), (np.array([2**31], np.int64), "[0, 2**31)"), ([1, -1], "[0, 2**31)")]
    for bad, why in cases:
        with pytest.raises(InvalidTokens) as err:
            m.add_request(bad)
        assert why in err.value.reason
        assert m.snapshot() == before
    assert check_invariants(m) == []


def test_j_a_list_of_floats_is_invalid_tokens() -> None:
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=16, key_seed=1))
    before = m.snapshot()
    with pytest.raises(InvalidTokens) as err:
        m.add_request([0.5, 2.0])
    assert "dtype" in err.value.reason
    assert m.snapshot() == before
    rid = m.add_request([1, 2, 3])
    before = m.snapshot()
    with pytest.raises(InvalidTokens) as err:
        m.append_tokens(rid, [4.0])
    assert "dtype" in err.value.reason
    assert m.snapshot() == before and m.request_tokens(rid)[2] == 3


def test_j_unknown_request_after_release() -> None:
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=16, key_seed=1))
    rid, _, _ = compute(m, tokens_of(20))
    before = m.snapshot()
    calls: list[tuple[str, Callable[[], object]]] = [
        ("match", lambda: m.match(rid)), ("allocate", lambda: m.allocate(rid, 1)),
        ("commit", lambda: m.commit(rid, 1)), ("release", lambda: m.release(rid)),
        ("append_tokens", lambda: m.append_tokens(rid, [1])), ("request_tokens", lambda: m.request_tokens(rid)),
        ("pinned", lambda: m.pinned(rid)), ("tables", lambda: m.tables(rid))]
    for action, call in calls:
        with pytest.raises(UnknownRequest) as err:
            call()
        assert (err.value.request_id, err.value.action) == (rid, action)
        assert m.snapshot() == before
    assert check_invariants(m) == []


def test_j_invalid_request_state() -> None:
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=16, key_seed=1))
    rid = m.add_request(tokens_of(20))
    m.allocate(rid, 8)
    before = m.snapshot()
    calls: list[tuple[str, Callable[[], object]]] = [
        ("commit", lambda: m.commit(rid, 9)), ("allocate", lambda: m.allocate(rid, 13)),
        ("commit", lambda: m.commit(rid, 0)), ("allocate", lambda: m.allocate(rid, 0)),
        ("commit", lambda: m.commit(rid, 2.5)), ("allocate", lambda: m.allocate(rid, True))]
    for action, call in calls:
        with pytest.raises(InvalidRequestState) as err:
            call()
        assert (err.value.request_id, err.value.action) == (rid, action)
        assert m.snapshot() == before
        assert m.request_tokens(rid) == (0, 8, 20)
    m.commit(rid, 8)
    assert m.request_tokens(rid) == (8, 8, 20)
    other = m.add_request(tokens_of(20))
    other_hit = m.match(other)
    before = m.snapshot()
    check: list[tuple[str, Callable[[], object]]] = [
        ("match", lambda: m.match(rid)),  # it already computes: no new hit
        ("acquire", lambda: m.acquire(rid, other_hit))]  # already acquired, and not its hit
    for action, call in check:
        with pytest.raises(InvalidRequestState) as err:
            call()
        assert (err.value.request_id, err.value.action) == (rid, action)
        assert m.snapshot() == before
    m.acquire(other, other_hit)
    with pytest.raises(InvalidRequestState) as err:
        m.acquire(other, other_hit)  # twice
    assert err.value.reason == "already acquired"
    assert check_invariants(m) == []


def test_j_admission_rejected_past_max_requests() -> None:
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=16, max_requests=2, key_seed=1))
    first = m.add_request(tokens_of(10))
    m.add_request(tokens_of(10, seed=1))
    before = m.snapshot()
    with pytest.raises(AdmissionRejected) as err:
        m.add_request(tokens_of(10, seed=2))
    assert (err.value.cap, err.value.limit, err.value.needed) == ("requests in flight", 2, 3)
    assert not isinstance(err.value, OutOfPages)
    assert m.snapshot() == before
    assert check_invariants(m) == []
    m.release(first)
    assert m.add_request(tokens_of(10, seed=2)) == 2
    assert check_invariants(m) == []


# ----------------------------------------------------------------------------- recurrent state


def scenario_recurrent_missing() -> Outcome:
    """tiny_linear (8-token blocks), points every 2 blocks: A computes 40 tokens; B shares A's first 24."""
    m = CacheManager(Layout.from_preset("tiny_linear"), ManagerConfig(default_pool_pages=32, retain_every_blocks=2,
                                                                      key_seed=1))
    out = Outcome(m)
    a = tokens_of(40)
    compute(m, a)
    out.notes["points"] = kept_points(m)
    rid = out.rids["B"] = m.add_request(np.concatenate([a[:24], fresh(8)]))
    out.hits["B"] = m.match(rid)
    return out


def test_recurrent_state_missing_between_points_shortens_the_hit() -> None:
    out = scenario_recurrent_missing()
    assert out.notes["points"] == [16, 32, 40]  # every second block, and the prompt's end
    hit = out.hits["B"]
    # the full-attention KV of all 3 shared blocks is there; the linear layers' state is kept at 16, not 24
    assert (hit.tokens, hit.candidate_tokens) == (16, 24)
    assert hit.codes == ("PARTIAL_BLOCK", "RECURRENT_MISSING", "LCM_BOUNDARY")  # the last block is B's own
    assert [(r.layer, r.detail) for r in hit.reasons][1] == (
        "multi_group", "linear.recurrent_state.conv+linear.recurrent_state.ssm: usable to block 2 < 3")
    assert sorted(hit.pages) == ["full.compressed_kv", "linear.recurrent_state.conv", "linear.recurrent_state.ssm"]
    assert check_invariants(out.m) == []


SCENARIOS: tuple[Callable[[], Outcome], ...] = (
    scenario_plain_prefix_hit, scenario_window_slid_past, scenario_lcm_rounded, scenario_partial_page_copy,
    scenario_isolation, scenario_failed_allocation_with_hit, scenario_stale_lease, scenario_abi_mismatch,
    scenario_misaligned_page, scenario_partial_block, scenario_compressed_missing, scenario_indexer_missing,
    scenario_tail_missing, scenario_eviction_order, scenario_shared_window_pages, scenario_prompt_end_inside_a_page,
    scenario_lcm_points_only, scenario_swa_full_match_agrees_with_acquire, scenario_max_tokens,
    scenario_recurrent_missing)


@pytest.mark.parametrize("layout", [tiny, flash16, llama])
def test_can_allocate_says_exactly_whether_allocate_fits_without_evicting(layout: Callable[[], Layout]) -> None:
    """can_allocate(rid, n) is True exactly when allocate(rid, n) succeeds on a clone without an eviction round."""
    m = CacheManager(layout(), ManagerConfig(default_pool_pages=24, key_seed=3, evict_slack_shift=None))
    for seed in range(3):
        compute(m, tokens_of(150, seed))
    rid = m.add_request(tokens_of(400, 9))
    m.acquire(rid, m.match(rid))
    before, answers = m.snapshot(), set()
    for count in range(1, 400 - m.request_tokens(rid)[0], 7):
        can = m.can_allocate(rid, count)
        twin = m.clone()
        try:
            twin.allocate(rid, count)
            fitted = twin.stats["evictions"] == m.stats["evictions"]
        except OutOfPages:
            fitted = False
        assert can == fitted, (count, can)
        answers.add(can)
    assert answers == {True, False}, "the sweep crosses the point where eviction starts"
    assert m.snapshot() == before, "can_allocate changes nothing"
