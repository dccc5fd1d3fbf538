"""Property tests: CacheManager.match agrees with a naive brute-force reference; F7.

Random multi-request histories (shared and diverging prefixes, random
allocate / commit chunk sizes, decode appends, releases, forced evictions,
random retention and occasionally no partial-page copy) on tiny_v4,
deepseek_v4_flash with 16-token blocks, llama_full and tiny_v32 (DeepSeek-V3.2's
latent with its indexer keys).  After every step a fresh probe request is matched and its hit must equal
``brute_force_hit_tokens``; ``check_invariants`` must stay empty; a failed
allocation (OutOfPages) must change nothing (F8); the first allocation after a
hit must carry exactly the copy-on-write / tail-seeding copies the hit implies
(run as a plan and completed before the commit), and every hit match returns
must be acquirable as it is (match and acquire share one definition of a usable
resume point: with window or tail pools, a KEPT point at the hit's end).

F7 (docs/failures.md): what the write side publishes at length L is exactly what
the lookup side returns at L.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hkv_core.layout import EntryKind, Layout
from hkv_core.manager import (
    Allocation,
    CacheManager,
    CopyPages,
    Hit,
    ManagerConfig,
    OutOfPages,
    StaleLease,
    check_invariants,
)
from hkv_core.manager import match as match_module
from hkv_core.manager.roles import tail as tail_role
from hkv_core.manager.roles import window as window_role
from hkv_core.plan import Completion
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
    # DeepSeek-V3.2: the latent and the indexer keys, two per-token kinds a hit must hold together
    "tiny_v32": Profile(layout=lambda: _layout("tiny_v32"), base_tokens=72, max_suffix=30, max_chunk=40,
                        pool_pages=(4, 30), max_examples=40),
    # a Qwen3-Next-style hybrid: full-attention KV over [0, P) and the linear layers' recurrent state at P
    "tiny_linear": Profile(layout=lambda: _layout("tiny_linear"), base_tokens=72, max_suffix=30, max_chunk=40,
                           pool_pages=(4, 30), max_examples=40),
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
        if not m.config.allow_partial_page_copy:
            assert hit.tokens % m.core.lcm_tokens == 0
        # what match returns, acquire accepts (nothing moved in between); an equal copy of the hit, so
        # acquire re-derives its pages from the index rather than recognizing match's own result
        m.clone().acquire(rid, attrs.evolve(hit))
    finally:
        m.release(rid)
    return hit.tokens


def _narrow_match(m: CacheManager, rid: int) -> Hit:
    """match() searching from a one-block window upward (widening as needed) instead of the default."""
    saved = match_module.SEARCH_BLOCKS
    match_module.SEARCH_BLOCKS = 1
    try:
        return m.match(rid)
    finally:
        match_module.SEARCH_BLOCKS = saved


def _same_hit(full: Hit, narrow: Hit) -> None:
    """The windowed search is exact: same length, reasons (with their details) and pages."""
    assert (narrow.tokens, narrow.reasons) == (full.tokens, full.reasons), f"{narrow} != {full}"
    assert {k: v.tolist() for k, v in narrow.pages.items()} == {k: v.tolist() for k, v in full.pages.items()}


def _expected_copies(m: CacheManager, hit: Hit, alloc: Allocation) -> set[CopyPages]:
    """The copies the first allocation after a hit at P must carry, derived from the hit alone:
    a prefix page that P splits after at least one entry is copied (its first (P mod page tokens) /
    ratio entries) into the request's new page for it; each tail pool's working page with rows at P
    is seeded from the snapshot at P, and each recurrent-state pool's working page from the whole state at P
    (one entry: copy-on-write, whatever P)."""
    resume, out = hit.tokens, set[CopyPages]()
    if not resume:
        return out
    for spec in m.layout.pools:
        ratio = spec.compress_ratio
        entries = resume % spec.tokens_per_page // max(1, ratio)
        if spec.entry_kind is EntryKind.COMPRESSED_ENTRY and entries:  # a page P splits with entries before P
            src = int(hit.pages[spec.name][-1])
            dst = int(alloc.block_tables[spec.name][resume // spec.tokens_per_page])
            out.add(CopyPages(pool=spec.name, src=src, dst=dst, entries=entries, src_version=int(
                hit.versions[spec.name][-1])))
        elif spec.entry_kind is EntryKind.TAIL_ROW:
            rows = 4 + resume % 4 if ratio == 4 else resume % ratio
            if not rows:  # nothing to seed
                continue
            src = int(hit.pages[spec.name][0])
            out.add(CopyPages(pool=spec.name, src=src, dst=alloc.tail_pages[spec.name], entries=rows,
                              src_version=int(hit.versions[spec.name][0])))
        elif spec.entry_kind in (EntryKind.CONV_STATE, EntryKind.SSM_STATE):
            out.add(CopyPages(pool=spec.name, src=int(hit.pages[spec.name][0]), dst=alloc.tail_pages[spec.name],
                              entries=1, src_version=int(hit.versions[spec.name][0])))
    return out


def _advance(m: CacheManager, data: st.DataObject, rid: int, profile: Profile, *, until_done: bool,
             pending_hit: dict[int, Hit]) -> None:
    """Allocate and commit random chunks: once, or until the request's known tokens are computed.

    A failed allocation (OutOfPages) must leave the manager as it was.  The first allocation after
    a hit carries exactly the copies the hit implies; later ones carry none.  The copies are completed
    at once (the engine runs them before the forward pass).
    """
    while True:
        computed, allocated, total = m.request_tokens(rid)
        if allocated < total and (allocated == computed or data.draw(st.booleans(), label="more")):
            count = data.draw(st.integers(1, min(profile.max_chunk, total - allocated)), label="alloc")
            before = m.snapshot()
            try:
                alloc = m.allocate(rid, count)
            except OutOfPages:
                assert m.request_tokens(rid) == (computed, allocated, total)
                assert m.snapshot() == before, "a failed allocation changed the manager (F8)"
                assert check_invariants(m) == []
                return
            hit = pending_hit.pop(rid, None)
            expected = _expected_copies(m, hit, alloc) if hit is not None else set()
            assert set(alloc.copies) == expected and len(alloc.copies) == len(expected)
            assert (alloc.plan is None) == (not expected)
            if alloc.plan is not None:
                m.complete(alloc.plan.plan_id, Completion())
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
        key_seed=7)
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
    assert len(m.core.requests) == 0


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
test_match_equals_brute_force_tiny_v32 = _history_test("tiny_v32")
test_match_equals_brute_force_tiny_linear = _history_test("tiny_linear")


# ----------------------------------------------------------------------------- F7


def _published_lengths(m: CacheManager, prompt_tokens: int, computed: int, start: int) -> list[int]:
    """Block boundaries L in (0, computed] that the write side published for a resume.

    L is a retention boundary (every `retain_every_blocks` blocks or the prompt's
    last block boundary; every boundary without windows and tails), and the LCM
    rule holds when partial-page copy is off.  Every prefix page over [0, L) is
    published: the pages the request completed at their commit, the page it
    stopped in sealed at its release.  `start` (the request's own hit) is
    excluded as it may come from elsewhere.
    """
    config, block = m.config, m.layout.block_tokens
    needs_points = any(spec.entry_kind is not EntryKind.COMPRESSED_ENTRY for spec in m.layout.pools)
    out = []
    for length in range(block, computed + 1, block):
        if length <= start:
            continue
        if needs_points:
            every = length // block % config.retain_every_blocks == 0
            end = config.retain_prompt_end and length == prompt_tokens // block * block
            if not (every or end):
                continue
        if not config.allow_partial_page_copy and length % m.core.lcm_tokens:
            continue
        out.append(length)
    return out


def _serve(m: CacheManager, rid: int, count: int) -> None:
    """Allocate `count` tokens, run the allocation's copies, commit."""
    alloc = m.allocate(rid, count)
    if alloc.plan is not None:
        m.complete(alloc.plan.plan_id, Completion())
    m.commit(rid, count)


@pytest.mark.parametrize("name", sorted(PROFILES))
@given(data=st.data())
@settings(max_examples=40)
def test_f7_every_published_length_is_returned_exactly(name: str, data: st.DataObject) -> None:
    """A request computes C tokens in random chunks and releases; nothing is evicted.  For every
    length L it published (a retained boundary; its prefix pages are published at commit or sealed
    at release), a new request with the same first L tokens and then different ones matches exactly L."""
    profile = PROFILES[name]
    layout = profile.layout()
    block = layout.block_tokens
    config = ManagerConfig(default_pool_pages=4096, retain_every_blocks=data.draw(st.integers(1, 4)),
                           allow_partial_page_copy=data.draw(st.sampled_from([True, True, False])), key_seed=11)
    m = CacheManager(layout, config)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    tokens = _tokens(rng, data.draw(st.integers(block + 1, profile.base_tokens)))
    start = 0
    if data.draw(st.booleans(), label="warm prefix"):
        # an earlier request computed a prefix: the request resumes from it (copy-on-write paths)
        warm = data.draw(st.integers(1, len(tokens)), label="warm tokens")
        first = m.add_request(tokens[:warm])
        _serve(m, first, warm)
        m.release(first)
    rid = m.add_request(tokens)
    hit = m.match(rid)
    m.acquire(rid, hit)
    start = hit.tokens
    target = data.draw(st.integers(start + 1, len(tokens)), label="computed")
    while m.request_tokens(rid)[0] < target:
        computed = m.request_tokens(rid)[0]
        _serve(m, rid, data.draw(st.integers(1, target - computed), label="chunk"))
    m.release(rid)
    assert m.stats["evicted_blocks"] == m.stats["evicted_points"] == 0
    assert check_invariants(m) == []
    lengths = _published_lengths(m, len(tokens), target, start)
    for length in lengths:
        probe = np.concatenate([tokens[:length], [FRESH_TOKEN], _tokens(rng, 3)])
        assert _probe(m, probe, None) == length
    if layout.name == "llama_full":  # every block boundary is a resume point: all of them came back
        assert lengths == list(range(max(start, 0) + block, target // block * block + 1, block))


# ----------------------------------------------------------------------------- the reference itself


def _prefix_column(m: CacheManager, pool: str) -> np.ndarray:
    """The block-table column (block -> object) of the page pool that layout pool `pool` belongs to."""
    return next(column for page_pool, column in m.core.index.blocks.refs if pool in page_pool.spec.member_names)


def test_brute_force_sees_every_object_kind() -> None:
    """Knock out one thing the hit at 40 needs (on tiny_v4, points at every block), each in a clone of
    the manager: the reference and match move together, to the exact expected length.  The prefix pages
    are per block; window pages and tail snapshots are reached only through the point kept at the hit's
    end, so knocking out a point (by hand, or by evicting it) stands for them."""
    m = CacheManager(_layout("tiny_v4"), ManagerConfig(default_pool_pages=64, retain_every_blocks=1, key_seed=3))
    tokens = np.random.default_rng(5).integers(0, VOCAB, 41, dtype=np.int64)
    rid = m.add_request(tokens)
    _serve(m, rid, 41)
    m.release(rid)
    probe = np.concatenate([tokens, [FRESH_TOKEN] * 9])
    assert _probe(m, probe, None) == 40
    ids = m.core.index.keys.lookup(m.core.hasher.hash_blocks(tokens)).tolist()
    assert m.index_counts()["points"] == 5  # at 8, 16, 24, 32, 40

    def knock_prefix(pool: str, block: int) -> Callable[[CacheManager], None]:
        def knock(c: CacheManager) -> None:
            _prefix_column(c, pool)[ids[block], 0] = 0  # the block refers to no page of that pool
        return knock

    def knock_point(*blocks: int) -> Callable[[CacheManager], None]:
        def knock(c: CacheManager) -> None:
            c.core.index.blocks.point[[ids[b] for b in blocks]] = -1  # no point kept at the block's end
        return knock

    def unindex(first: int) -> Callable[[CacheManager], None]:
        def knock(c: CacheManager) -> None:  # a chain loses its tail (only leaves leave the index)
            for block in range(len(ids) - 1, first - 1, -1):
                key = c.core.index.blocks.key[ids[block]]
                assert c.core.index.keys.remove(int(key[0]), int(key[1])) == ids[block]
        return knock

    cases: list[tuple[str, Callable[[CacheManager], None], int]] = [
        (f"{spec.name} page of block 2", knock_prefix(spec.name, 2), 16)
        for spec in m.layout.pools if spec.entry_kind is EntryKind.COMPRESSED_ENTRY]
    cases += [
        ("point at 40 (its window page and tail snapshots)", knock_point(4), 32),
        ("point at 24", knock_point(2), 40),
        ("points at 40 and 32", knock_point(4, 3), 24),
        ("points at 40, 32 and 24", knock_point(4, 3, 2), 16),
        ("block 4 unindexed", unindex(4), 32),
        ("blocks 3 and 4 unindexed", unindex(3), 24),
        ("every block unindexed", unindex(0), 0),
        ("the point at 40 evicted", lambda c: c.evict(max_units=1), 32),
    ]
    assert len(cases) == 3 + 8
    for what, knock, expected in cases:
        clone = m.clone()
        knock(clone)
        assert _probe(clone, probe, None) == expected, what
    assert _probe(m, probe, None) == 40  # the original is untouched


def test_brute_force_catches_a_match_that_ignores_kept_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken variant of 0c572f4: window and tail conditions that accept every block boundary (window
    rows present per block) instead of a KEPT point.  On swa_full, a 340-token request after 320- and
    352-token ones then matches 336 where no point is kept; the reference says 320."""
    m = CacheManager(_layout("swa_full"), ManagerConfig(key_seed=0))
    base = np.arange(400, dtype=np.int64)
    for end in (320, 352):
        rid = m.add_request(base[:end])
        hit = m.match(rid)
        m.acquire(rid, hit)
        _serve(m, rid, end - hit.tokens)
        m.release(rid)
    assert _probe(m, base[:340], None) == 320

    def every_boundary(role: object, ids: np.ndarray, lo: int) -> np.ndarray:
        return np.ones(len(ids) + 1 - lo, np.bool_)

    monkeypatch.setattr(window_role, "point_kept", every_boundary)
    monkeypatch.setattr(tail_role, "point_kept", every_boundary)
    rid = m.add_request(base[:340])
    hit = m.match(rid)
    assert (hit.tokens, brute_force_hit_tokens(m, rid)) == (336, 320)
    with pytest.raises(StaleLease) as err:  # what the defect looked like to an engine
        m.acquire(rid, attrs.evolve(hit))  # a copy: acquire re-derives the hit from the index
    assert (err.value.pool, err.value.fields["expected_state"]) == ("resume_point", "KEPT")
