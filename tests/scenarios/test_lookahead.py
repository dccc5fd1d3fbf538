"""Slots reserved ahead of the known tokens (`allocate_ahead`, docs/manager.md "Slots reserved ahead").

Two watermarks: a position's KV is shared (hashed, indexed, published, kept
as a resume point, served to another request) only once it is verified
(`append_tokens` gave its token) and written (`commit` covered it).  The
scenarios run on tiny_csa with 4-token blocks and a resume point at every
block, so a hit can end at any block boundary; the broken variants show
that `check_invariants` catches a manager that commits past its known tokens
or never verifies what it learnt, and that the lifecycle table itself refuses
to publish an AHEAD object.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hkv_core.errors import IllegalTransition, InvalidRequestArgument, OutOfPages
from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig, admit, check_invariants
from hkv_core.manager.manager import CacheManager as Manager
from hkv_core.manager.requests import RequestState
from hkv_core.plan import Completion
from hkv_core.spec.names import Event

PROMPT = list(range(1, 9))  # two blocks
NEXT = [11, 12, 13, 14]  # the tokens sampled later for the positions reserved ahead


def manager(pages: int = 16, **config: Any) -> CacheManager:
    layout = Layout.from_preset("tiny_csa", block_tokens=4)
    return CacheManager(layout, ManagerConfig(default_pool_pages=pages, retain_every_blocks=1, key_seed=3, **config))


def prefilled(m: CacheManager, tokens: list[int] = PROMPT) -> int:
    rid = m.add_request(tokens)
    m.acquire(rid, m.match(rid))
    alloc = m.allocate(rid, len(tokens))
    if alloc.plan is not None:
        m.complete(alloc.plan.plan_id, Completion())
    m.commit(rid, len(tokens))
    return rid


def hit_of(m: CacheManager, tokens: list[int]) -> int:
    """The hit another request with `tokens` gets (released again, nothing pinned)."""
    other = m.add_request(tokens)
    found = m.match(other).tokens
    m.release(other)
    return found


def states(m: CacheManager, rid: int) -> set[str]:
    return {s for pool, pages in m.owned(rid).items() for s in m.pages(pool, pages).states}


def test_ahead_then_append_then_commit_serves_exactly_the_verified_and_written_prefix() -> None:
    m = manager()
    rid = prefilled(m)
    alloc = m.allocate_ahead(rid, 8)
    assert (alloc.start_tokens, alloc.num_tokens) == (8, 8)
    assert m.request_tokens(rid) == (8, 16, 8)
    assert "AHEAD" in states(m, rid)
    later = NEXT + [15, 16, 17, 18]
    assert hit_of(m, PROMPT + later + [99]) == 8, "nothing past the known tokens is served"
    m.append_tokens(rid, later[:4])  # 12 verified; nothing more written
    assert hit_of(m, PROMPT + later + [99]) == 8, "verified but not written: not served"
    m.commit(rid, 4)  # verified and written up to 12 (the indexer page [8, 16) completes at 16)
    assert m.request_tokens(rid) == (12, 16, 12)
    m.append_tokens(rid, later[4:])
    assert "AHEAD" not in states(m, rid)
    m.commit(rid, 4)  # verified and written up to 16: published, indexed, resume points kept
    assert m.request_tokens(rid) == (16, 16, 16)
    assert hit_of(m, PROMPT + later + [99]) == 16
    assert hit_of(m, PROMPT + later[:4] + [15, 16, 17, 99, 99]) == 12, "block keys cover the verified tokens"
    assert check_invariants(m) == []


def test_what_ahead_publishes_equals_what_decoding_without_it_publishes() -> None:
    """Reserving ahead, then appending, publishes exactly what appending, then allocating, publishes (F7)."""
    hits = []
    for ahead in (True, False):
        m = manager()
        rid = prefilled(m)
        if ahead:
            m.allocate_ahead(rid, 4)
            m.append_tokens(rid, NEXT)
        else:
            m.append_tokens(rid, NEXT)
            m.allocate(rid, 4)
        m.commit(rid, 4)
        live = hit_of(m, PROMPT + NEXT + [99])
        m.release(rid)  # seals the indexer page [8, 16) at 12: a hit at 12 now reads it
        hits.append((live, hit_of(m, PROMPT + NEXT + [99]), m.index_counts()))
    assert hits[0] == hits[1] and hits[0][:2] == (8, 12), hits


def test_page_ids_stay_across_append_tokens() -> None:
    """An engine wrote the allocation's pages into its block tables: append_tokens verifies them in place."""
    m = manager()
    rid = prefilled(m)
    alloc = m.allocate_ahead(rid, 6)
    tables = m.tables(rid)
    handed_out = {pool: pages.tolist() for pool, pages in alloc.block_tables.items()}
    m.append_tokens(rid, NEXT[:2])  # half of them known: the rest stay AHEAD
    assert m.tables(rid) == tables and "AHEAD" in states(m, rid)
    m.append_tokens(rid, [*NEXT[2:], 15, 16])  # (the compressed page [12, 16) still needs token 15: AHEAD)
    assert m.tables(rid) == tables
    for pool, pages in handed_out.items():
        assert m.tables(rid)[pool][:len(pages)] == pages
    m.commit(rid, 6)  # (the window then slides: pages below it leave the table, the others stay)
    assert all(page in (0, tables[pool][i]) for pool, pages in m.tables(rid).items() for i, page in enumerate(pages))
    assert check_invariants(m) == []


def test_commit_past_the_known_tokens_is_refused_and_changes_nothing() -> None:
    m = manager()
    rid = prefilled(m)
    m.allocate_ahead(rid, 4)
    m.append_tokens(rid, NEXT[:1])
    before = m.snapshot()
    with pytest.raises(InvalidRequestArgument, match=r"must lie in \[1, 1\].*9 known"):
        m.commit(rid, 2)
    assert m.snapshot() == before
    m.commit(rid, 1)
    assert m.request_tokens(rid) == (9, 12, 9) and check_invariants(m) == []


def test_release_frees_unverified_reservations_and_publishes_nothing_of_them() -> None:
    m = manager()
    rid = prefilled(m)
    free = {pool: m.free_pages(pool) for pool in m.tables(rid)}
    counts = m.index_counts()
    m.allocate_ahead(rid, 8)
    assert all(m.free_pages(pool) <= n for pool, n in free.items())
    m.release(rid)
    assert m.index_counts() == counts, "no block or point of an unverified slot"
    assert hit_of(m, PROMPT + NEXT + [15, 16, 17, 18, 99]) == 8
    assert "AHEAD" not in {s for pool in free for s in m.pages(pool).states}
    assert check_invariants(m) == []


def test_allocate_ahead_bounds_change_nothing() -> None:
    m = manager(pages=3, max_request_tokens=16)
    rid = prefilled(m)
    before = m.snapshot()
    with pytest.raises(InvalidRequestArgument, match="max_request_tokens 16"):
        m.allocate_ahead(rid, 9)
    with pytest.raises(InvalidRequestArgument):
        m.allocate_ahead(rid, 0)
    with pytest.raises(OutOfPages):
        m.allocate_ahead(rid, 8)  # 3 pages a pool: fewer than the 4 blocks of 16 tokens the window needs
    assert m.snapshot() == before
    m.allocate_ahead(rid, 4)
    with pytest.raises(InvalidRequestArgument):  # allocate stays bounded by the known tokens
        m.allocate(rid, 1)
    assert check_invariants(m) == []


# ------------------------------------------------------------------ broken variants


def _loose_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commit bounded by the allocated tokens, not the known ones (the manager before allocate_ahead)."""
    real = Manager._count

    def loose(self: Manager, req: RequestState, action: str, value: object, room: int) -> int:
        return real(self, req, action, value, req.allocated - req.computed if action == "commit" else room)

    monkeypatch.setattr(Manager, "_count", loose)


def test_broken_commit_past_known_is_caught_by_check_invariants(monkeypatch: pytest.MonkeyPatch) -> None:
    _loose_commit(monkeypatch)
    m = manager()
    rid = prefilled(m)
    m.allocate_ahead(rid, 2)
    m.commit(rid, 2)  # inside a block: nothing due for publishing, so the table has nothing to refuse
    broken = check_invariants(m)
    assert any(b.startswith("ahead_never_published") and "past its 8 known" in b for b in broken), broken


def test_the_table_refuses_to_publish_a_slot_reserved_ahead() -> None:
    """Whatever a verb asks, no publish, seal or lease edge leaves AHEAD: the compiled table refuses."""
    m = manager()
    rid = prefilled(m)
    m.allocate_ahead(rid, 4)
    req = m.core.requests.by_rid[rid]
    ahead = np.array(req.ahead, np.intp)
    assert ahead.size
    before = m.snapshot()
    for event in (Event.PUBLISH, Event.PUBLISH_PINNED, Event.SEAL, Event.PIN, Event.VERIFY):
        with pytest.raises(IllegalTransition, match="AHEAD"):
            m.core.objects.step(ahead, event, req.slot)
    assert m.snapshot() == before


def test_broken_append_that_never_verifies_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admit, "verify_known", lambda core, req: None)
    m = manager()
    rid = prefilled(m)
    m.allocate_ahead(rid, 4)
    m.append_tokens(rid, NEXT)
    broken = check_invariants(m)
    assert any(b.startswith("ahead_never_published") and "already known" in b for b in broken), broken
