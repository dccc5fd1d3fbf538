"""Property tests: CacheManager.match agrees with a naive brute-force reference; F7.

Random multi-request histories (shared and diverging prefixes, random
allocate / commit chunk sizes, decode appends, releases, forced evictions,
random retention and occasionally no partial-page copy) on tiny_v4,
deepseek_v4_flash with 16-token blocks and llama_full.  After every step a
fresh probe request is matched and its hit must equal
``brute_force_hit_tokens``; ``check_invariants`` must stay empty; a failed
allocation (OutOfPages) must change nothing (F8); the first allocation after a
hit must carry exactly the copy-on-write / tail-seeding copies the hit implies.

F7 (``FAILURES.md``): what the write side publishes at length L is exactly what
the lookup side returns at L.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hkv_core.layout import Layout
from hkv_core.manager import (
    Allocation,
    CacheManager,
    CopyPages,
    Hit,
    ManagerConfig,
    OutOfPages,
    PoolRole,
    check_invariants,
)
from hkv_core.manager import hit as hit_module
from hkv_core.testing.brute_force import brute_force_hit_tokens

VOCAB = 1000  # random token ids lie in [0, VOCAB)
FRESH_TOKEN = VOCAB + 7  # never drawn at random: makes a block differ from every cached one


@attrs.frozen(kw_only=True)
class Profile:
    """Sizes that make one layout's histories interesting (tokens scale with its pages)."""

    layout: Callable[[], Layout]
    base_tokens: int  # length of each shared base sequence
    max_suffix: int  # random tokens after the shared part
    max_chunk: int  # largest allocate chunk
    pool_pages: tuple[int, int]  # range of default_pool_pages (small: evictions and OutOfPages happen)
    max_examples: int


@functools.cache
def _layout(name: str, block_tokens: int | None = None) -> Layout:
    if block_tokens is None:
        return Layout.from_preset(name)
    return Layout.from_preset(name, block_tokens=block_tokens)


PROFILES = {
    "tiny_v4": Profile(layout=lambda: _layout("tiny_v4"), base_tokens=72, max_suffix=30, max_chunk=40,
                       pool_pages=(6, 40), max_examples=60),
    "flash16": Profile(layout=lambda: _layout("deepseek_v4_flash", 16), base_tokens=1150, max_suffix=200,
                       max_chunk=700, pool_pages=(60, 260), max_examples=25),
    "llama_full": Profile(layout=lambda: _layout("llama_full"), base_tokens=180, max_suffix=40, max_chunk=90,
                          pool_pages=(6, 30), max_examples=50),
}

OPS = ("start", "start", "advance", "advance", "advance", "finish", "finish", "release", "release", "evict",
       "decode")


def _tokens(rng: np.random.Generator, count: int) -> np.ndarray:
    return rng.integers(0, VOCAB, count, dtype=np.int64)


def _probe(m: CacheManager, tokens: np.ndarray, salt: str | None) -> int:
    """Match a fresh request for `tokens`; assert it equals the brute force; return the hit."""
    rid = m.add_request(tokens, cache_salt=salt)
    try:
        hit = m.match(rid)
        expected = brute_force_hit_tokens(m, rid)
        assert hit.tokens == expected, f"match {hit.tokens} ({hit.codes}) != brute force {expected}"
        _same_hit(hit, _narrow_match(m, rid))
        assert hit.tokens % m.layout.block_tokens == 0 and hit.tokens < len(tokens) or hit.tokens == 0
        if not m.core.config.allow_partial_page_copy:
            assert hit.tokens % m.core.lcm_tokens == 0
    finally:
        m.release(rid)
    return hit.tokens


def _narrow_match(m: CacheManager, rid: int) -> Hit:
    """match() searching from a one-block window upward (widening as needed) instead of the default."""
    saved = hit_module.SEARCH_BLOCKS
    hit_module.SEARCH_BLOCKS = 1
    try:
        return m.match(rid)
    finally:
        hit_module.SEARCH_BLOCKS = saved


def _same_hit(full: Hit, narrow: Hit) -> None:
    """The windowed search is exact: same length, reasons (with their details) and pages."""
    assert (narrow.tokens, narrow.reasons) == (full.tokens, full.reasons), f"{narrow} != {full}"
    assert {k: v.tolist() for k, v in narrow.pages.items()} == {k: v.tolist() for k, v in full.pages.items()}


def _fingerprint(m: CacheManager) -> tuple[object, ...]:
    """Pages, pins, index and requests: what a failed allocation must leave as it was."""
    core = m.core
    pools = tuple((p.state.tobytes(), p.version.tobytes(), p.leases.tobytes(), p.holders.tobytes(),
                   tuple(p.free)) for p in core.pools)
    arena = (core.arena.alive.tobytes(), core.arena.point.tobytes(), core.arena.prefix_pages.tobytes(),
             core.arena.window_pages.tobytes(), core.arena.tail_pages.tobytes())
    requests = tuple((rid, r.computed, r.allocated, r.acquired, tuple(r.chain), tuple(map(tuple, r.tables)))
                     for rid, r in sorted(core.requests.items()))
    return pools, arena, requests, core.keys.count


def _expected_copies(m: CacheManager, hit: Hit, alloc: Allocation) -> set[CopyPages]:
    """The copies the first allocation after a hit at P must carry, derived from the hit alone:
    a prefix page that P splits after at least one entry is copied (its first (P mod page tokens) /
    ratio entries) into the request's new page for it; each tail pool's working page with rows at P
    is seeded from the snapshot at P."""
    resume, out = hit.tokens, set[CopyPages]()
    if not resume:
        return out
    for info in m.core.infos:
        ratio = info.spec.compress_ratio
        entries = resume % info.spec.tokens_per_page // max(1, ratio)
        if info.role is PoolRole.PREFIX and entries:  # a page P splits with entries before P
            src = int(hit.pages[info.name][-1])
            dst = int(alloc.block_tables[info.name][resume // info.spec.tokens_per_page])
            out.add(CopyPages(pool=info.name, src=src, dst=dst, entries=entries, src_version=int(
                hit.versions[info.name][-1])))
        elif info.role is PoolRole.TAIL:
            rows = 4 + resume % 4 if ratio == 4 else resume % ratio
            if not rows:  # nothing to seed
                continue
            src = int(hit.pages[info.name][0])
            out.add(CopyPages(pool=info.name, src=src, dst=alloc.tail_pages[info.name], entries=rows,
                              src_version=int(hit.versions[info.name][0])))
    return out


def _advance(m: CacheManager, data: st.DataObject, rid: int, profile: Profile, *, until_done: bool,
             pending_hit: dict[int, Hit]) -> None:
    """Allocate and commit random chunks: once, or until the request's known tokens are computed.

    A failed allocation (OutOfPages) must leave the manager as it was.  The first allocation after
    a hit carries exactly the copies the hit implies; later ones carry none.
    """
    while True:
        computed, allocated, total = m.request_tokens(rid)
        if allocated < total and (allocated == computed or data.draw(st.booleans(), label="more")):
            count = data.draw(st.integers(1, min(profile.max_chunk, total - allocated)), label="alloc")
            before = _fingerprint(m)
            try:
                alloc = m.allocate(rid, count)
            except OutOfPages:
                assert m.request_tokens(rid) == (computed, allocated, total)
                assert _fingerprint(m) == before, "a failed allocation changed the manager (F8)"
                assert check_invariants(m) == []
                return
            hit = pending_hit.pop(rid, None)
            expected = _expected_copies(m, hit, alloc) if hit is not None else set()
            assert set(alloc.copies) == expected and len(alloc.copies) == len(expected)
        computed, allocated, total = m.request_tokens(rid)
        if allocated > computed:
            everything = data.draw(st.integers(0, 2), label="commit all?") > 0
            count = allocated - computed if everything else data.draw(st.integers(1, allocated - computed))
            m.commit(rid, count)
            assert m.request_tokens(rid)[0] == computed + count
        if not until_done or m.request_tokens(rid)[0] == total:
            return


def _probe_tokens(data: st.DataObject, rng: np.random.Generator, bases: list[np.ndarray],
                  known: list[np.ndarray], profile: Profile) -> np.ndarray:
    """A prefix of a base or of a request seen so far, then random (possibly no) tokens."""
    pool = bases + known
    source = pool[data.draw(st.integers(0, len(pool) - 1), label="probe source")]
    cut = data.draw(st.integers(0, len(source)), label="probe cut")
    extra = data.draw(st.integers(0 if cut else 1, profile.max_suffix), label="probe extra")
    return np.concatenate([source[:cut], _tokens(rng, extra)])


def _random_history(name: str, data: st.DataObject) -> None:
    profile = PROFILES[name]
    layout = profile.layout()
    block = layout.block_tokens
    config = ManagerConfig(
        default_pool_pages=data.draw(st.integers(*profile.pool_pages), label="pool pages"),
        retain_every_blocks=data.draw(st.integers(1, 4), label="retain_every_blocks"),
        allow_partial_page_copy=data.draw(st.sampled_from([True, True, True, False]), label="partial copy"),
        seed=7)
    m = CacheManager(layout, config)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="token seed"))
    bases = [_tokens(rng, profile.base_tokens) for _ in range(2)]
    live: dict[int, tuple[np.ndarray, str | None]] = {}
    pending_hit: dict[int, Hit] = {}  # hits whose first allocation has not happened yet
    known: list[np.ndarray] = []
    steps = data.draw(st.integers(3, 22), label="steps")
    for _ in range(steps):
        op = data.draw(st.sampled_from(OPS), label="op")
        if op == "start" or not live and op != "evict":
            base = bases[data.draw(st.integers(0, 1), label="base")]
            cut = data.draw(st.integers(0, len(base)), label="cut")
            extra = data.draw(st.integers(0 if cut else 1, profile.max_suffix), label="suffix")
            tokens = np.concatenate([base[:cut], _tokens(rng, extra)])
            salt = data.draw(st.sampled_from([None, None, None, "tenant-b"]), label="salt")
            rid = m.add_request(tokens, cache_salt=salt)
            if data.draw(st.integers(0, 4), label="match?"):
                hit = m.match(rid)
                assert hit.tokens == brute_force_hit_tokens(m, rid)
                m.acquire(rid, hit)
                assert m.request_tokens(rid)[:2] == (hit.tokens, hit.tokens)
                pending_hit[rid] = hit
            live[rid] = (tokens, salt)
            known.append(tokens)
        elif op in ("advance", "finish"):
            rid = data.draw(st.sampled_from(sorted(live)), label="request")
            _advance(m, data, rid, profile, until_done=op == "finish", pending_hit=pending_hit)
        elif op == "decode":
            rid = data.draw(st.sampled_from(sorted(live)), label="request")
            computed, allocated, total = m.request_tokens(rid)
            if computed == total:
                more = _tokens(rng, data.draw(st.integers(1, block + 2), label="decoded"))
                m.append_tokens(rid, more)
                tokens, salt = live[rid]
                live[rid] = (np.concatenate([tokens, more]), salt)
                known.append(live[rid][0])
                assert m.request_tokens(rid) == (computed, allocated, total + len(more))
        elif op == "release":
            rid = data.draw(st.sampled_from(sorted(live)), label="request")
            m.release(rid)
            del live[rid]
        else:
            m.evict(max_units=data.draw(st.integers(1, 8), label="max_units"))
        probe = _probe_tokens(data, rng, bases, known, profile)
        _probe(m, probe, data.draw(st.sampled_from([None, None, "tenant-b"]), label="probe salt"))
        # the probes of every live request's own tokens (longest shared prefixes) agree as well
        for tokens, salt in list(live.values())[:2]:
            _probe(m, np.concatenate([tokens, [FRESH_TOKEN]]), salt)
        assert check_invariants(m) == []
    for rid in sorted(live):
        m.release(rid)
    assert check_invariants(m) == []
    assert not m.core.requests


def _history_test(name: str) -> Callable[[], None]:
    @settings(max_examples=PROFILES[name].max_examples)
    @given(data=st.data())
    def test(data: st.DataObject) -> None:
        _random_history(name, data)

    test.__doc__ = f"match == brute force after every step of random histories on {name}."
    return test


test_match_equals_brute_force_tiny_v4 = _history_test("tiny_v4")
test_match_equals_brute_force_flash16 = _history_test("flash16")
test_match_equals_brute_force_llama_full = _history_test("llama_full")


# ----------------------------------------------------------------------------- F7


def _published_lengths(m: CacheManager, prompt_tokens: int, computed: int, start: int) -> list[int]:
    """Block boundaries L in (0, computed] that the write side published for a resume.

    L is a retention boundary (every `retain_every_blocks` blocks or the prompt's
    last block boundary; every boundary without windows and tails), every prefix
    page over [0, L) was completed by the request (so it was published), and the
    LCM rule holds when partial-page copy is off.  `start` (the request's own
    hit) is excluded as it may come from elsewhere.
    """
    core = m.core
    block = core.block_tokens
    needs_points = bool(core.by_role[PoolRole.WINDOW] or core.by_role[PoolRole.TAIL])
    out = []
    for length in range(block, computed + 1, block):
        if length <= start:
            continue
        if needs_points:
            every = length // block % core.config.retain_every_blocks == 0
            end = core.config.retain_prompt_end and length == prompt_tokens // block * block
            if not (every or end):
                continue
        pages_done = all(math.ceil(length / core.infos[p].spec.tokens_per_page)
                         * core.infos[p].spec.tokens_per_page <= computed
                         for p in core.by_role[PoolRole.PREFIX])
        if not pages_done:
            continue
        if not core.config.allow_partial_page_copy and length % core.lcm_tokens:
            continue
        out.append(length)
    return out


@pytest.mark.parametrize("name", sorted(PROFILES))
@given(data=st.data())
@settings(max_examples=40)
def test_f7_every_published_length_is_returned_exactly(name: str, data: st.DataObject) -> None:
    """A request computes C tokens in random chunks and releases; nothing is evicted.  For every
    length L it published (a retained boundary whose prefix pages are complete), a new request
    with the same first L tokens and then different ones matches exactly L."""
    profile = PROFILES[name]
    layout = profile.layout()
    block = layout.block_tokens
    config = ManagerConfig(default_pool_pages=4096, retain_every_blocks=data.draw(st.integers(1, 4)),
                           allow_partial_page_copy=data.draw(st.sampled_from([True, True, False])), seed=11)
    m = CacheManager(layout, config)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    tokens = _tokens(rng, data.draw(st.integers(block + 1, profile.base_tokens)))
    start = 0
    if data.draw(st.booleans(), label="warm prefix"):
        # an earlier request computed a prefix: the request resumes from it (copy-on-write paths)
        warm = data.draw(st.integers(1, len(tokens)), label="warm tokens")
        first = m.add_request(tokens[:warm])
        m.allocate(first, warm)
        m.commit(first, warm)
        m.release(first)
    rid = m.add_request(tokens)
    hit = m.match(rid)
    m.acquire(rid, hit)
    start = hit.tokens
    target = data.draw(st.integers(start + 1, len(tokens)), label="computed")
    while m.request_tokens(rid)[0] < target:
        computed = m.request_tokens(rid)[0]
        count = data.draw(st.integers(1, target - computed), label="chunk")
        m.allocate(rid, count)
        m.commit(rid, count)
    m.release(rid)
    assert m.core.stats["evicted_blocks"] == m.core.stats["evicted_points"] == 0
    assert check_invariants(m) == []
    lengths = _published_lengths(m, len(tokens), target, start)
    for length in lengths:
        probe = np.concatenate([tokens[:length], [FRESH_TOKEN], _tokens(rng, 3)])
        assert _probe(m, probe, None) == length
    if layout.name == "llama_full":  # every block boundary is a resume point: all of them came back
        assert lengths == list(range(max(start, 0) + block, target // block * block + 1, block))


# ----------------------------------------------------------------------------- the reference itself


def test_brute_force_sees_every_object_kind() -> None:
    """Knock out one object the hit at 40 needs (on tiny_v4, points at every block): the reference and
    match move together, to the exact expected length; restoring it restores the hit."""
    m = CacheManager(_layout("tiny_v4"), ManagerConfig(default_pool_pages=64, retain_every_blocks=1, seed=3))
    tokens = np.random.default_rng(5).integers(0, VOCAB, 41, dtype=np.int64)
    rid = m.add_request(tokens)
    m.allocate(rid, 41)
    m.commit(rid, 41)
    m.release(rid)
    probe = np.concatenate([tokens, [FRESH_TOKEN] * 9])
    assert _probe(m, probe, None) == 40
    core, arena = m.core, m.core.arena
    ids = core.keys.lookup(core.hasher.hash_blocks(tokens)).tolist()
    cases: list[tuple[str, Any, tuple[int, ...], int]] = []  # (what, arena column, index, hit without it)
    for pool in core.by_role[PoolRole.PREFIX]:
        cases.append((f"{core.infos[pool].name} page of block 2", arena.prefix_pages, (ids[2], core.column[pool]),
                      16))
    for pool in core.by_role[PoolRole.WINDOW]:  # W = 8: the point at 40 reads block 4's window rows only
        cases.append((f"{core.infos[pool].name} of block 4", arena.window_pages, (ids[4], core.column[pool]), 32))
        cases.append((f"{core.infos[pool].name} of block 3", arena.window_pages, (ids[3], core.column[pool]), 40))
    for pool in core.by_role[PoolRole.TAIL]:
        cases.append((f"{core.infos[pool].name} at 40", arena.tail_pages, (ids[4], core.column[pool]), 32))
    cases.append(("point at 24", arena.point, (ids[2],), 40))
    cases.append(("point at 40", arena.point, (ids[4],), 32))
    for what, column, where, expected in cases:
        saved = column[where].copy()
        column[where] = 0
        assert _probe(m, probe, None) == expected, what
        column[where] = saved
        assert _probe(m, probe, None) == 40, what
    key = arena.key[ids[3]]
    assert core.keys.remove(int(key[0]), int(key[1])) == ids[3]  # an unindexed block ends the chain
    assert _probe(m, probe, None) == 24
    core.keys.insert(int(key[0]), int(key[1]), ids[3])
    assert _probe(m, probe, None) == 40
