"""A linear hybrid's recurrent state on the live manager (tiny_linear): one snapshot per kept resume point,
copied on write into the working state of a request that resumes there, and the invariant snapshots_unshared
shown able to fail on two broken variants of the manager's tail role."""

from __future__ import annotations

import numpy as np
import pytest

from hkv_core.layout import Layout, ObjectKind
from hkv_core.manager import CacheManager, ManagerConfig, check_invariants
from hkv_core.manager.roles import tail
from hkv_core.plan import Completion

BLOCK = 8  # tiny_linear's block


def _manager() -> CacheManager:
    return CacheManager(Layout.from_preset("tiny_linear"),
                        ManagerConfig(default_pool_pages=24, retain_every_blocks=1, key_seed=5))


def _serve(m: CacheManager, tokens: np.ndarray, count: int) -> int:
    rid = m.add_request(tokens)
    hit = m.match(rid)
    m.acquire(rid, hit)
    alloc = m.allocate(rid, count - hit.tokens)
    if alloc.plan is not None:
        m.complete(alloc.plan.plan_id, Completion())
    m.commit(rid, count - hit.tokens)
    return rid


def test_a_hit_resumes_at_every_kept_point_and_copies_the_state() -> None:
    m = _manager()
    prompt = np.arange(40) % 64
    m.release(_serve(m, prompt, 33))
    for cut in (8, 16, 24, 32):  # every block boundary kept a point with its own state snapshot
        rid = m.add_request(np.concatenate([prompt[:cut], [63, 62]]))
        hit = m.match(rid)
        assert hit.tokens == cut
        state = [name for name in hit.pages if "recurrent_state" in name]
        assert len(state) == 2  # the convolution and the SSM state, one page each
        m.acquire(rid, hit)
        alloc = m.allocate(rid, 2)
        copies = {c.pool: c for c in alloc.copies}
        for name in state:  # copy-on-write: the whole state (one entry) into the request's own working page
            assert copies[name].entries == 1 and copies[name].src == int(hit.pages[name][0])
            assert copies[name].dst == alloc.tail_pages[name] != copies[name].src
        assert check_invariants(m) == []
        assert alloc.plan is not None
        m.complete(alloc.plan.plan_id, Completion())
        m.release(rid)
    assert check_invariants(m) == []


def test_evicting_the_state_at_a_point_shortens_the_hit_saying_why() -> None:
    m = _manager()
    prompt = np.arange(40) % 64
    m.release(_serve(m, prompt, 33))
    rid = m.add_request(np.concatenate([prompt[:32], [1]]))
    hit = m.match(rid)
    assert hit.tokens == 32
    m.evict()
    hit = m.match(rid)
    assert hit.tokens == 0 and check_invariants(m) == []


def test_broken_variant_two_points_share_one_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    """take_points gives every due point the first one's snapshot: caught as a snapshot of several points."""
    original = tail.TailRole.take_points

    def shared(self: tail.TailRole, *args: object, **kwargs: object) -> list[np.ndarray]:
        out = original(self, *args, **kwargs)  # type: ignore[arg-type]
        return [np.repeat(column[:1], len(column), axis=0) for column in out]

    monkeypatch.setattr(tail.TailRole, "take_points", shared)
    m = _manager()
    rid = _serve(m, np.arange(40) % 64, 24)  # three boundaries in one commit
    problems = check_invariants(m)
    assert any(p.startswith("snapshots_unshared") and "snapshot of 3 resume points" in p for p in problems), problems
    del rid


def test_broken_variant_a_request_computes_in_the_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The seed skips copy-on-write and makes the hit's snapshot the working state: caught."""
    def in_place(self: tail.TailRole, pool: object, req: object, working: int, out: object) -> None:
        src = req.tail_sources.pop(pool.index)  # type: ignore[attr-defined]
        req.tables[pool.index].put(0, src, int(self.objects.slot[src]))  # type: ignore[attr-defined]

    m = _manager()
    prompt = np.arange(40) % 64
    m.release(_serve(m, prompt, 33))
    monkeypatch.setattr(tail.TailRole, "_seed_copy", in_place)
    rid = m.add_request(np.concatenate([prompt[:16], [9, 9]]))
    m.acquire(rid, m.match(rid))
    m.allocate(rid, 2)
    problems = check_invariants(m)
    assert any(p.startswith("snapshots_unshared") and "a resume point's snapshot" in p for p in problems), problems


def test_the_recurrent_kind_is_the_layouts() -> None:
    layout = Layout.from_preset("tiny_linear")
    assert layout.object_kinds() == (ObjectKind.COMPRESSED_KV, ObjectKind.RECURRENT_STATE)
