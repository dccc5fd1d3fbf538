"""Scenario tests of the cache manager with exact expected values.

Every scenario is built by a `scenario_*` helper (listed in SCENARIOS) that
drives a manager and returns what it observed; the tests assert exact hit
lengths, reason codes, page ids, copies and which blocks survive eviction.
`test_reason_codes.py` runs the same helpers and checks that together they
produce every reason code of specs/validation.toml.

Page ids are deterministic: every pool hands out its lowest free page first
and a freed page is the next one handed out.
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
    PoolRole,
    StaleLease,
    UnknownRequest,
    check_invariants,
)
from hkv_core.testing.brute_force import brute_force_hit_tokens

FRESH = 50_000  # token ids >= FRESH never occur in a cached prefix: a block made of them always misses


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


def compute(m: CacheManager, tokens: np.ndarray, *, upto: int | None = None, chunk: int | None = None,
            release: bool = True, **extra: Any) -> tuple[int, Hit, list[Allocation]]:
    """Add a request, match + acquire its hit, allocate and commit up to `upto` tokens in chunks."""
    rid = m.add_request(tokens, **extra)
    hit = m.match(rid)
    m.acquire(rid, hit)
    end = len(tokens) if upto is None else upto
    allocs = []
    while (done := m.request_tokens(rid)[0]) < end:
        count = end - done if chunk is None else min(chunk, end - done)
        allocs.append(m.allocate(rid, count))
        m.commit(rid, count)
    if release:
        m.release(rid)
    return rid, hit, allocs


def probe(m: CacheManager, tokens: np.ndarray, **extra: Any) -> Hit:
    """The hit a fresh request for `tokens` would get (the request is released again).

    Every probe is also checked against the naive reference (hkv_core.testing.brute_force).
    """
    rid = m.add_request(tokens, **extra)
    try:
        hit = m.match(rid)
        assert hit.tokens == brute_force_hit_tokens(m, rid)
        return hit
    finally:
        m.release(rid)


def fingerprint(m: CacheManager) -> dict[str, Any]:
    """Everything a failed call must leave as it was."""
    core = m.core
    return {
        "requests": {rid: (r.computed, r.allocated, len(r.tokens), r.acquired, sorted(r.chain),
                           [dict(v) for v in r.pinned_versions], [sorted(o) for o in r.owned],
                           [list(t) for t in r.tables]) for rid, r in core.requests.items()},
        "next_rid": core.next_rid,
        "free": [list(p.free) for p in core.pools],
        "pages": [(p.state.tobytes(), p.version.tobytes(), p.leases.tobytes(), p.holders.tobytes(),
                   p.owner.tobytes()) for p in core.pools],
        "arena": (core.arena.live, core.arena.alive.tobytes(), core.arena.point.tobytes(),
                  core.arena.prefix_pages.tobytes(), core.arena.window_pages.tobytes(),
                  core.arena.tail_pages.tobytes()),
        "keys": core.keys.count,
    }


def pool_of(m: CacheManager, name: str) -> Any:
    return m.core.pools[m.core.pool_index[name]]


def page_state(m: CacheManager, pool: str, page: int) -> str:
    return str(pool_of(m, pool).state_name(page))


def alive_positions(m: CacheManager, tokens: np.ndarray) -> int:
    """How many leading blocks of `tokens` (no salt, no LoRA) are still indexed (key lookups only)."""
    keys = m.core.hasher.hash_blocks(tokens)
    ids = m.core.keys.lookup(keys)
    missing = np.flatnonzero(ids < 0)
    return int(missing[0]) if missing.size else len(ids)


# ----------------------------------------------------------------------------- (a) plain prefix hit


def scenario_plain_prefix_hit() -> Outcome:
    """llama_full: A computes 40 tokens; B shares A's first 2 blocks; C repeats B's 50 tokens."""
    m = CacheManager(llama(), ManagerConfig(default_pool_pages=16, seed=1))
    out = Outcome(m)
    a = np.arange(100, 140, dtype=np.int64)
    _, out.hits["A"], (out.allocs["A"],) = compute(m, a)
    b = np.concatenate([a[:32], fresh(18)])
    out.rids["B"] = rid = m.add_request(b)
    out.hits["B"] = m.match(rid)
    m.acquire(rid, out.hits["B"])
    out.notes["B acquired"] = m.request_tokens(rid)
    out.notes["B leases"] = pool_of(m, "full.compressed_kv").leases[:5].tolist()
    out.allocs["B"] = m.allocate(rid, 18)
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
    assert first.copies == () and first.tail_pages == {} and first.snapshots == {}

    hit = out.hits["B"]
    assert (hit.tokens, hit.candidate_tokens, hit.codes, hit.partial_copy) == (32, 32, ("LCM_BOUNDARY",), False)
    assert hit.block_ids.tolist() == [0, 1]
    assert {k: v.tolist() for k, v in hit.pages.items()} == {name: [1, 2]}
    assert {k: v.tolist() for k, v in hit.versions.items()} == {name: [0, 0]}
    assert out.notes["B acquired"] == (32, 32, 50)
    assert out.notes["B leases"] == [0, 1, 1, 0, 0]  # the hit's pages are pinned once each
    alloc = out.allocs["B"]
    assert (alloc.start_tokens, alloc.num_tokens) == (32, 18)
    assert alloc.block_tables[name].tolist() == [1, 2, 3, 4]  # page 3 came back to the free list
    assert alloc.slots[name].tolist() == list(range(48, 66))
    assert alloc.copies == ()

    again = out.hits["C"]  # the whole 50-token prompt is cached up to 48: at least one token computes
    assert (again.tokens, again.candidate_tokens) == (48, 48)
    assert again.codes == ("PARTIAL_BLOCK", "LCM_BOUNDARY")
    assert again.pages[name].tolist() == [1, 2, 3]
    assert [page_state(m, name, p) for p in range(1, 6)] == ["PUBLISHED"] * 3 + ["FREE"] * 2
    assert check_invariants(m) == []


# ----------------------------------------------------------------------------- (b) window slid past


def scenario_window_slid_past() -> Outcome:
    """tiny_v4, points only at prompt ends: 16 (an earlier 17-token request) and 40 (A, 41 tokens).
    B shares A's first 3 blocks: A's window at block 2 slid away and no point is kept at 24."""
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=32, retain_every_blocks=100, seed=1))
    out = Outcome(m)
    a = tokens_of(41, seed=2)
    compute(m, a[:17])
    out.rids["A"], _, _ = compute(m, a, chunk=8)
    out.hits["B"] = probe(m, np.concatenate([a[:24], fresh(9)]))
    out.hits["A+"] = probe(m, np.concatenate([a, fresh(9)]))
    keys = m.core.hasher.hash_blocks(a)
    out.notes["blocks"] = m.core.keys.lookup(keys).tolist()
    return out


def test_b_window_slid_past_a_resume_point() -> None:
    out = scenario_window_slid_past()
    m, arena = out.m, out.m.core.arena
    blocks = out.notes["blocks"]
    assert all(b >= 0 for b in blocks)  # all 5 blocks of A are indexed
    points = sorted((int(arena.position[b]) + 1) * 8 for b in np.flatnonzero(arena.point & arena.alive))
    assert points == [16, 40]
    for pool in m.core.by_role[PoolRole.WINDOW]:  # every window pool: block 2's page slid away
        assert arena.window_pages[blocks[2], m.core.column[pool]] == NULL_PAGE
        assert arena.window_pages[blocks[1], m.core.column[pool]] != NULL_PAGE  # held by the point at 16
    hit = out.hits["B"]
    assert (hit.tokens, hit.candidate_tokens) == (16, 24)
    assert hit.codes == ("WINDOW_MISSING", "TAIL_MISSING", "INDEXER_MISSING", "LCM_BOUNDARY")
    details = {r.code: r.detail for r in hit.reasons}
    assert details["WINDOW_MISSING"].count("usable to block 2 < 3") == 3  # swa, csa and hca windows
    assert "csa.indexer_state.tail" in details["INDEXER_MISSING"]
    assert out.hits["A+"].tokens == 40 and out.hits["A+"].codes == ("LCM_BOUNDARY",)
    assert check_invariants(m) == []


# ----------------------------------------------------------------------------- (c) (d) LCM and CoW


def scenario_flash_page_rules(partial: bool) -> Outcome:
    """flash (16-token blocks): A computes 1600 tokens (points every 4 blocks); B shares 1280 of them."""
    m = CacheManager(flash16(), ManagerConfig(default_pool_pages=256, retain_every_blocks=4,
                                              allow_partial_page_copy=partial, seed=1))
    out = Outcome(m)
    a = tokens_of(1600)
    _, _, (out.allocs["A"],) = compute(m, a)
    rid = out.rids["B"] = m.add_request(np.concatenate([a[:1280], fresh(20)]))
    out.hits["B"] = m.match(rid)
    m.acquire(rid, out.hits["B"])
    out.allocs["B"] = m.allocate(rid, 20)
    out.notes["hca states"] = [page_state(m, "hca.compressed_kv", p) for p in range(1, 5)]
    out.notes["hca leases"] = pool_of(m, "hca.compressed_kv").leases[1:5].tolist()
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
    assert out.allocs["A"].block_tables["hca.compressed_kv"].tolist() == [1, 2, 3, 4]
    hit = out.hits["B"]
    assert (hit.tokens, hit.candidate_tokens, hit.partial_copy) == (1024, 1280, False)
    assert hit.tokens % 512 == 0
    assert hit.codes == ("LCM_ROUNDED", "LCM_BOUNDARY")
    assert hit.reasons[0].layer == "whole_block" and "lcm=512" in hit.reasons[0].detail
    assert hit.pages["hca.compressed_kv"].tolist() == [1, 2]  # whole pages, shared without copies
    alloc = out.allocs["B"]
    assert alloc.block_tables["hca.compressed_kv"].tolist() == [1, 2, 4]
    # only the tails with rows at P are seeded (the HCA tail is empty at a multiple of 128)
    assert [c.pool for c in alloc.copies] == ["csa.compressor_tail", "csa.indexer_state.tail"]
    assert [c.entries for c in alloc.copies] == [4, 4]  # 4 overlap rows each
    assert out.notes["invariants"] == []


def test_d_partial_page_copy_copies_the_shared_hca_page() -> None:
    out = scenario_partial_page_copy()
    hit = out.hits["B"]
    assert (hit.tokens, hit.candidate_tokens, hit.partial_copy) == (1280, 1280, True)
    assert hit.codes == ("PARTIAL_PAGE_COPY",)
    assert hit.pages["hca.compressed_kv"].tolist() == [1, 2, 3]
    snapshot = int(hit.pages["csa.compressor_tail"][0])
    assert snapshot == 21  # A's working tail page is 1, then one snapshot page per 64 tokens: 1280 -> 21
    alloc = out.allocs["B"]
    assert CopyPages(pool="hca.compressed_kv", src=3, dst=4, entries=2, src_version=0) in alloc.copies
    assert alloc.copies == (
        CopyPages(pool="csa.compressor_tail", src=21, dst=1, entries=4, src_version=0),
        CopyPages(pool="csa.indexer_state.tail", src=21, dst=1, entries=4, src_version=0),
        CopyPages(pool="hca.compressed_kv", src=3, dst=4, entries=2, src_version=0),  # (1280 - 1024) / 128
    )  # no hca.compressor_tail copy: 1280 % 128 == 0 rows to seed
    assert alloc.block_tables["hca.compressed_kv"].tolist() == [1, 2, 4]  # page 3 replaced by its copy
    # 1280 is aligned to the 16-token csa pages: the 80 shared pages are read in place, 2 new ones follow
    assert alloc.block_tables["csa.compressed_kv"].tolist() == [*range(1, 81), 101, 102]
    assert alloc.tail_pages == {"csa.compressor_tail": 1, "csa.indexer_state.tail": 1, "hca.compressor_tail": 1}
    assert out.notes["hca states"] == ["PUBLISHED", "PUBLISHED", "PUBLISHED", "RESERVED"]
    assert out.notes["hca leases"] == [1, 1, 1, 0]  # the shared source stays pinned, the copy is owned
    assert out.notes["invariants"] == []


# ----------------------------------------------------------------------------- (e) isolation


def scenario_isolation() -> Outcome:
    """tiny_v4: A computes 33 tokens with salt 'tenant-a' and LoRA 1; probes vary the extras."""
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=32, retain_every_blocks=2, seed=1))
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
    m = CacheManager(llama(), ManagerConfig(default_pool_pages=4, seed=1))
    rid = m.add_request(np.arange(100, dtype=np.int64))
    before = fingerprint(m)
    with pytest.raises(OutOfPages) as err:
        m.allocate(rid, 80)
    assert (err.value.pool, err.value.needed, err.value.free) == ("full.compressed_kv", 5, 4)
    assert err.value.fields["pool"] == "full.compressed_kv"
    assert m.request_tokens(rid) == (0, 0, 100)
    assert len(m.core.pools[0].free) == 4
    assert fingerprint(m) == before
    assert check_invariants(m) == []
    alloc = m.allocate(rid, 64)  # what does fit still works: nothing leaked
    assert alloc.block_tables["full.compressed_kv"].tolist() == [1, 2, 3, 4]
    assert check_invariants(m) == []


def scenario_failed_allocation_with_hit() -> Outcome:
    """tiny_v4, hca.compressed_kv has 6 pages.  A (33 tokens) is cached; B resumes at 16 from it and
    asks for 40 more tokens: 5 hca pages, but only 2 are free and 2 more could be evicted."""
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=32, pool_pages={"hca.compressed_kv": 6},
                                           retain_every_blocks=2, seed=1))
    out = Outcome(m)
    a = tokens_of(33, seed=4)
    compute(m, a)
    rid = out.rids["B"] = m.add_request(np.concatenate([a[:16], fresh(40)]))
    out.hits["B"] = m.match(rid)
    m.acquire(rid, out.hits["B"])
    out.notes["before"] = fingerprint(m)
    out.notes["free"] = [len(p.free) for p in m.core.pools]
    try:
        m.allocate(rid, 40)
    except OutOfPages as err:
        out.notes["error"] = err
    out.notes["after"] = fingerprint(m)
    return out


def test_f_failed_allocation_changes_nothing_with_a_hit_and_evictable_pages() -> None:
    out = scenario_failed_allocation_with_hit()
    m = out.m
    assert out.hits["B"].tokens == 16
    err = out.notes["error"]
    assert isinstance(err, OutOfPages)
    assert (err.pool, err.needed, err.free) == ("hca.compressed_kv", 5, 2)
    assert m.request_tokens(out.rids["B"]) == (16, 16, 56)
    assert [len(p.free) for p in m.core.pools] == out.notes["free"]
    assert out.notes["after"] == out.notes["before"]  # no eviction, no pin, no page moved (F8)
    assert check_invariants(m) == []
    assert m.allocate(out.rids["B"], 8).block_tables["hca.compressed_kv"].tolist() == [1, 2, 5]


def test_f_allocation_evicts_a_cold_chain_when_that_is_enough() -> None:
    m = CacheManager(llama(), ManagerConfig(default_pool_pages=8, seed=1))
    a = np.arange(64, dtype=np.int64)
    compute(m, a)  # 4 cached pages, nothing pinned
    rid = m.add_request(fresh(96))  # 6 pages: 4 free + 2 from evicting A's last two blocks
    alloc = m.allocate(rid, 96)
    assert alloc.block_tables["full.compressed_kv"].tolist() == [3, 4, 5, 6, 7, 8]
    assert probe(m, np.concatenate([a, fresh(17)])).tokens == 32  # A's head survives (LRU: tail first)
    assert check_invariants(m) == []


# ----------------------------------------------------------------------------- (g) stale lease


def scenario_stale_lease() -> Outcome:
    """tiny_v4: A (41 tokens) is cached; B matches 40 tokens, then everything is evicted."""
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=32, retain_every_blocks=2, seed=1))
    out = Outcome(m)
    a = tokens_of(41, seed=5)
    compute(m, a)
    rid = out.rids["B"] = m.add_request(np.concatenate([a, fresh(1)]))
    out.hits["B"] = m.match(rid)
    out.notes["evicted"] = m.evict()
    with pytest.raises(StaleLease) as err:
        m.acquire(rid, out.hits["B"])
    out.notes["error"] = err.value
    out.hits["B again"] = m.match(rid)
    return out


def test_g_lease_invalidated_by_eviction() -> None:
    out = scenario_stale_lease()
    m, rid = out.m, out.rids["B"]
    assert out.hits["B"].tokens == 40 and out.hits["B"].codes == ("PARTIAL_BLOCK", "LCM_BOUNDARY")
    assert out.hits["B"].pages["swa.swa_window"].tolist() == [5]  # block 4's window page, held by point 40
    # 5 units in LRU order, deepest first: block 4 with the point at 40, block 3 with the point at 32,
    # block 2, block 1 with the point at 16, block 0 (a leaf's point goes with it as one unit)
    assert out.notes["evicted"] == 5
    err = out.notes["error"]
    assert (err.pool, err.page, err.expected_version, err.found_version, err.request_id) == (
        "swa.swa_window", 5, 0, 1, rid)
    assert err.fields == {"pool": "swa.swa_window", "page": 5, "expected_version": 0, "found_version": 1,
                          "request_id": rid, "expected_state": "PUBLISHED", "found_state": "FREE"}
    assert [int(p.leases.sum()) for p in m.core.pools] == [0] * len(m.core.pools)
    req = m.core.requests[rid]
    assert not req.acquired and all(not v for v in req.pinned_versions) and req.chain == []
    assert m.request_tokens(rid) == (0, 0, 42)
    assert m.core.arena.live == 0 and m.core.keys.count == 0
    assert out.hits["B again"].tokens == 0 and out.hits["B again"].codes == ()
    assert check_invariants(m) == []


# ----------------------------------------------------------------------------- (h) reason codes


def scenario_abi_mismatch() -> Outcome:
    layout = tiny()
    accepted = frozenset(p.abi_id for p in layout.pools if p.name != "hca.compressed_kv")
    m = CacheManager(layout, ManagerConfig(default_pool_pages=32, retain_every_blocks=2, accepted_abi=accepted,
                                           seed=1))
    out = Outcome(m)
    a = tokens_of(33, seed=6)
    compute(m, a)
    out.hits["probe"] = probe(m, np.concatenate([a, fresh(9)]))
    return out


def scenario_misaligned_page() -> Outcome:
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=32, retain_every_blocks=2,
                                           device_alignment_bytes=8192, seed=1))
    out = Outcome(m)
    a = tokens_of(33, seed=6)
    compute(m, a)
    out.hits["probe"] = probe(m, np.concatenate([a, fresh(9)]))
    return out


def scenario_partial_block() -> Outcome:
    """llama_full: A computes 48 tokens; probes end exactly on, and inside, A's last block."""
    m = CacheManager(llama(), ManagerConfig(default_pool_pages=16, seed=1))
    out = Outcome(m)
    a = tokens_of(48, seed=7)
    compute(m, a)
    out.hits["whole prompt cached"] = probe(m, a)
    out.hits["ends inside a block"] = probe(m, a[:40])
    out.hits["one more block"] = probe(m, np.concatenate([a, fresh(17)]))
    return out


def scenario_flash_missing(computed: int, shared: int) -> Outcome:
    """flash: A computes `computed` tokens (points every 4 blocks); the probe shares `shared` of them."""
    m = CacheManager(flash16(), ManagerConfig(default_pool_pages=256, retain_every_blocks=4, seed=1))
    out = Outcome(m)
    a = tokens_of(1600, seed=8)
    compute(m, a[:computed])
    out.hits["probe"] = probe(m, np.concatenate([a[:shared], fresh(17)]))
    out.notes["a"] = a
    return out


def scenario_compressed_missing() -> Outcome:
    return scenario_flash_missing(computed=700, shared=688)


def scenario_indexer_missing() -> Outcome:
    return scenario_flash_missing(computed=1552, shared=1552)


def scenario_tail_missing() -> Outcome:
    return scenario_flash_missing(computed=600, shared=112)


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


def test_h_compressed_missing_mid_hca_page() -> None:
    """A ended at 700, inside the HCA page [512, 1024) (entry 4 done at 639, the page never completed)
    and the indexer page [640, 704).  A resume at 688 needs HCA entries 0..4, so page 1: NULL.  Only
    entries j < P // 128 are read, so P <= 624 needs page 0 alone; the nearest point is 576."""
    out = scenario_compressed_missing()
    hit, m = out.hits["probe"], out.m
    assert (hit.tokens, hit.candidate_tokens) == (576, 688)
    assert hit.codes == ("INDEXER_MISSING", "COMPRESSED_MISSING", "TAIL_MISSING", "LCM_BOUNDARY")
    details = dict((r.code, r.detail) for r in hit.reasons)
    assert details["COMPRESSED_MISSING"] == "hca.compressed_kv: usable to block 39 < 43"
    assert details["INDEXER_MISSING"].startswith("csa.indexer_state.keys: usable to block 40 < 43")
    ids = m.core.keys.lookup(m.core.hasher.hash_blocks(out.notes["a"][:688]))
    assert np.all(ids >= 0)
    col = m.core.column[m.core.pool_index["hca.compressed_kv"]]
    assert m.core.arena.prefix_pages[ids[32:], col].tolist() == [NULL_PAGE] * 11
    assert np.all(m.core.arena.prefix_pages[ids[:32], col] == 1)


def test_h_indexer_missing_mid_indexer_page() -> None:
    """A ended at 1552, inside the indexer page [1536, 1600) (and the HCA page [1536, 2048))."""
    out = scenario_indexer_missing()
    hit, m = out.hits["probe"], out.m
    assert (hit.tokens, hit.candidate_tokens) == (1536, 1552)
    # HCA entries j < 12 fill pages 0..2 exactly: the open HCA page [1536, 2048) is not read
    assert hit.codes == ("INDEXER_MISSING", "LCM_BOUNDARY")
    assert dict((r.code, r.detail) for r in hit.reasons)["INDEXER_MISSING"] == (
        "csa.indexer_state.keys: usable to block 96 < 97")
    ids = m.core.keys.lookup(m.core.hasher.hash_blocks(out.notes["a"][:1552]))
    col = m.core.column[m.core.pool_index["csa.indexer_state.keys"]]
    assert int(m.core.arena.prefix_pages[ids[96], col]) == NULL_PAGE
    assert int(m.core.arena.prefix_pages[ids[95], col]) != NULL_PAGE


def test_h_tail_missing_while_the_window_is_present() -> None:
    """The probe shares 112 tokens: the point at 128 holds the window rows of blocks 0..7, but no
    tail snapshot exists at 112 (points every 64 tokens): the hit falls back to 64."""
    hit = scenario_tail_missing().hits["probe"]
    assert (hit.tokens, hit.candidate_tokens, hit.partial_copy) == (64, 112, False)
    assert hit.codes == ("TAIL_MISSING", "INDEXER_MISSING", "LCM_BOUNDARY")  # no HCA entry before 64
    details = dict((r.code, r.detail) for r in hit.reasons)
    assert details["TAIL_MISSING"] == ("csa.compressor_tail: usable to block 4 < 7; "
                                       "hca.compressor_tail: usable to block 4 < 7")
    assert details["INDEXER_MISSING"] == "csa.indexer_state.tail: usable to block 4 < 7"


# ----------------------------------------------------------------------------- (i) eviction order


def scenario_eviction_order() -> Outcome:
    """tiny_v4, points every 2 blocks.  A (33 tokens: blocks 0..3, points 16 and 32) is older than
    B (17 tokens: blocks 0..1, point 16).  Evict one unit at a time."""
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=32, retain_every_blocks=2, seed=1))
    out = Outcome(m)
    a, b = tokens_of(33, seed=9), tokens_of(17, seed=10)
    compute(m, a)
    compute(m, b)
    out.notes["a"], out.notes["b"] = a, b
    a_ids = m.core.keys.lookup(m.core.hasher.hash_blocks(a)).tolist()
    out.notes["a ids"] = a_ids
    window = m.core.column[m.core.pool_index["swa.swa_window"]]
    out.notes["window pages"] = [int(m.core.arena.window_pages[i, window]) for i in a_ids]
    steps: list[dict[str, Any]] = []
    for _ in range(6):
        evicted = m.evict(max_units=1)
        steps.append({
            "evicted": evicted,
            "a blocks": alive_positions(m, a),
            "b blocks": alive_positions(m, b),
            "a hit": probe(m, np.concatenate([a, fresh(9)])),
            "b hit": probe(m, np.concatenate([b, fresh(9)])),
            "window states": [page_state(m, "swa.swa_window", p) for p in out.notes["window pages"]
                              if p != NULL_PAGE],
            "stats": dict(m.core.stats),
        })
    out.notes["steps"] = steps
    for i, step in enumerate(steps):
        out.hits[f"a{i}"], out.hits[f"b{i}"] = step["a hit"], step["b hit"]
    return out


def test_i_dependency_aware_lru_eviction_order() -> None:
    out = scenario_eviction_order()
    assert out.notes["window pages"] == [NULL_PAGE, 2, NULL_PAGE, 4]  # only blocks before points 16, 32
    s = out.notes["steps"]
    # 1: A's deepest block 3 (oldest, leaf) goes with its point at 32 and the window page it held
    assert (s[0]["evicted"], s[0]["a blocks"], s[0]["b blocks"]) == (1, 3, 2)
    assert s[0]["window states"] == ["PUBLISHED", "FREE"]  # the point at 16 keeps block 1's window page
    assert (s[0]["a hit"].tokens, s[0]["b hit"].tokens) == (16, 16)
    assert s[0]["a hit"].codes == ("WINDOW_MISSING", "TAIL_MISSING", "INDEXER_MISSING", "LCM_BOUNDARY")
    assert (s[0]["stats"]["evicted_points"], s[0]["stats"]["evicted_blocks"]) == (1, 1)
    # 2: A's block 2, now a leaf without a point; A's point at 16 and its window page survive
    assert (s[1]["a blocks"], s[1]["b blocks"], s[1]["a hit"].tokens) == (2, 2, 16)
    assert s[1]["window states"] == ["PUBLISHED", "FREE"]
    assert (s[1]["stats"]["evicted_points"], s[1]["stats"]["evicted_blocks"]) == (1, 2)
    # 3: A's block 1 with the point at 16: now its window page goes
    assert (s[2]["a blocks"], s[2]["b blocks"], s[2]["a hit"].tokens, s[2]["b hit"].tokens) == (1, 2, 0, 16)
    assert s[2]["window states"] == ["FREE", "FREE"]
    # 4: A's block 0; 5, 6: B's block 1 (with its point), then block 0
    assert [(x["a blocks"], x["b blocks"]) for x in s[3:]] == [(0, 2), (0, 1), (0, 0)]
    assert [x["evicted"] for x in s] == [1] * 6
    assert s[4]["b hit"].tokens == 0
    assert check_invariants(out.m) == []


def scenario_shared_window_pages() -> Outcome:
    """flash (W = 128 tokens = 8 blocks), points every 4 blocks: A computes 520 tokens (blocks 0..31,
    points at 64, 128, ..., 512).  The point at 64k holds the window pages of blocks 4k-8 .. 4k-1, so
    each window page is shared by the two points whose windows overlap it."""
    m = CacheManager(flash16(), ManagerConfig(default_pool_pages=64, retain_every_blocks=4, seed=1))
    out = Outcome(m)
    a = tokens_of(520, seed=14)
    compute(m, a)
    ids = m.core.keys.lookup(m.core.hasher.hash_blocks(a)).tolist()
    col = m.core.column[m.core.pool_index["hca.swa_window"]]
    pool = pool_of(m, "hca.swa_window")
    out.notes["pages"] = pages = [int(m.core.arena.window_pages[i, col]) for i in ids]

    def look() -> dict[str, Any]:
        return {"holders": [int(pool.holders[p]) for p in pages], "states": [pool.state_name(p) for p in pages],
                "blocks": alive_positions(m, a), "hit": probe(m, np.concatenate([a[:512], fresh(17)]))}

    out.notes["steps"] = [look()]
    for _ in range(5):
        m.evict(max_units=1)
        out.notes["steps"].append(look())
    for i, step in enumerate(out.notes["steps"]):
        out.hits[f"step {i}"] = step["hit"]
    return out


def test_i_window_pages_live_while_a_point_needs_them() -> None:
    out = scenario_shared_window_pages()
    s = out.notes["steps"]
    assert out.notes["pages"] == list(range(1, 33))  # one window page per block, in block order
    assert s[0]["holders"] == [2] * 28 + [1] * 4  # blocks 28..31 are only in the window of the point at 512
    assert (s[0]["blocks"], s[0]["hit"].tokens) == (32, 512)
    # 1: block 31 with the point at 512 goes: blocks 28..31's pages are freed, 24..27 keep the point at 448
    assert s[1]["holders"] == [2] * 24 + [1] * 4 + [0] * 4
    assert s[1]["states"] == ["PUBLISHED"] * 28 + ["FREE"] * 4
    assert (s[1]["blocks"], s[1]["hit"].tokens, s[1]["hit"].candidate_tokens) == (31, 448, 496)
    assert s[1]["hit"].codes == ("WINDOW_MISSING", "TAIL_MISSING", "INDEXER_MISSING", "PARTIAL_PAGE_COPY")
    # 2..4: the leaf blocks 30, 29, 28 (no point, no window page left) go one by one
    assert [x["blocks"] for x in s[2:5]] == [30, 29, 28]
    assert all(x["holders"] == s[1]["holders"] and x["hit"].tokens == 448 for x in s[2:5])
    # 5: block 27 with the point at 448: blocks 24..27's pages are freed, 20..23 are still held by 384
    assert s[5]["holders"] == [2] * 20 + [1] * 4 + [0] * 8
    assert s[5]["states"] == ["PUBLISHED"] * 24 + ["FREE"] * 8
    assert (s[5]["blocks"], s[5]["hit"].tokens) == (27, 384)
    assert check_invariants(out.m) == []


def test_i_pinned_hit_survives_evict_all() -> None:
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=32, retain_every_blocks=2, seed=1))
    a = tokens_of(33, seed=11)
    compute(m, a)
    rid = m.add_request(np.concatenate([a[:16], fresh(9)]))
    hit = m.match(rid)
    m.acquire(rid, hit)
    m.evict()
    assert alive_positions(m, a) == 2  # blocks 0, 1 and the point at 16 are pinned by the lease
    assert probe(m, np.concatenate([a, fresh(9)])).tokens == 16
    m.release(rid)
    m.evict()
    assert alive_positions(m, a) == 0
    assert check_invariants(m) == []


def test_i_evict_several_units_is_still_lru() -> None:
    m = CacheManager(llama(), ManagerConfig(default_pool_pages=32, seed=1))
    a, b = tokens_of(64, seed=12), tokens_of(32, seed=13)
    compute(m, a)  # older: 4 blocks
    compute(m, b)  # newer: 2 blocks
    assert m.evict(max_units=2) == 2
    # LRU: A's blocks 3 and 2 (both older than anything of B) go; B stays whole
    assert (alive_positions(m, a), alive_positions(m, b)) == (2, 2)


# ----------------------------------------------------------------------------- (j) bad input


def test_j_invalid_tokens_change_nothing() -> None:
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=16, seed=1))
    compute(m, tokens_of(20), release=False)
    before = fingerprint(m)
    cases: list[tuple[Any, str]] = [
        (np.array([1.0, 2.0]), "dtype"), (np.zeros((2, 8), np.int64), "1-D"), (np.array([1, -1, 3]), "[0, 2**31)"),
        ([0.5, 2.0], "dtype"), (np.array([[3]], np.int32), "1-D"), (np.array([2**31], np.int64), "[0, 2**31)")]
    for bad, why in cases:
        with pytest.raises(InvalidTokens) as err:
            m.add_request(bad)
        assert why in err.value.reason
        assert fingerprint(m) == before
    assert check_invariants(m) == []


def test_j_unknown_request_after_release() -> None:
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=16, seed=1))
    rid, _, _ = compute(m, tokens_of(20))
    before = fingerprint(m)
    calls: list[tuple[str, Callable[[], object]]] = [
        ("match", lambda: m.match(rid)), ("allocate", lambda: m.allocate(rid, 1)),
        ("commit", lambda: m.commit(rid, 1)), ("release", lambda: m.release(rid)),
        ("append_tokens", lambda: m.append_tokens(rid, [1])), ("request_tokens", lambda: m.request_tokens(rid))]
    for action, call in calls:
        with pytest.raises(UnknownRequest) as err:
            call()
        assert (err.value.request_id, err.value.action) == (rid, action)
        assert fingerprint(m) == before
    assert check_invariants(m) == []


def test_j_invalid_request_state() -> None:
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=16, seed=1))
    rid = m.add_request(tokens_of(20))
    m.allocate(rid, 8)
    before = fingerprint(m)
    calls: list[tuple[str, Callable[[], object]]] = [
        ("commit", lambda: m.commit(rid, 9)), ("allocate", lambda: m.allocate(rid, 13)),
        ("commit", lambda: m.commit(rid, 0)), ("allocate", lambda: m.allocate(rid, 0))]
    for action, call in calls:
        with pytest.raises(InvalidRequestState) as err:
            call()
        assert (err.value.request_id, err.value.action) == (rid, action)
        assert fingerprint(m) == before
        assert m.request_tokens(rid) == (0, 8, 20)
    m.commit(rid, 8)
    assert m.request_tokens(rid) == (8, 8, 20)
    other = m.add_request(tokens_of(20))
    other_hit = m.match(other)
    before = fingerprint(m)
    check: list[tuple[str, Callable[[], object]]] = [
        ("match", lambda: m.match(rid)),  # it already computes: no new hit
        ("acquire", lambda: m.acquire(rid, other_hit))]  # already acquired, and not its hit
    for action, call in check:
        with pytest.raises(InvalidRequestState) as err:
            call()
        assert (err.value.request_id, err.value.action) == (rid, action)
        assert fingerprint(m) == before
    m.acquire(other, other_hit)
    with pytest.raises(InvalidRequestState) as err:
        m.acquire(other, other_hit)  # twice
    assert err.value.reason == "already acquired"
    assert check_invariants(m) == []


def test_j_admission_rejected_past_max_requests() -> None:
    m = CacheManager(tiny(), ManagerConfig(default_pool_pages=16, max_requests=2, seed=1))
    first = m.add_request(tokens_of(10))
    m.add_request(tokens_of(10, seed=1))
    before = fingerprint(m)
    with pytest.raises(AdmissionRejected) as err:
        m.add_request(tokens_of(10, seed=2))
    assert (err.value.cap, err.value.limit, err.value.needed) == ("requests in flight", 2, 3)
    assert not isinstance(err.value, OutOfPages)
    assert fingerprint(m) == before
    assert check_invariants(m) == []
    m.release(first)
    assert m.add_request(tokens_of(10, seed=2)) == 2
    assert check_invariants(m) == []


SCENARIOS: tuple[Callable[[], Outcome], ...] = (
    scenario_plain_prefix_hit, scenario_window_slid_past, scenario_lcm_rounded, scenario_partial_page_copy,
    scenario_isolation, scenario_failed_allocation_with_hit, scenario_stale_lease, scenario_abi_mismatch,
    scenario_misaligned_page, scenario_partial_block, scenario_compressed_missing, scenario_indexer_missing,
    scenario_tail_missing, scenario_eviction_order, scenario_shared_window_pages)
