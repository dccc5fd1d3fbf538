"""Speculative steps for the manager state machine (hkv_core.testing.manager_machine).

One rule runs a whole step on a live request - propose k draft tokens, let
something else happen while it is in flight, then accept n of them or reject
it - and checks (docs/drafts.md):

- a request that cannot start a step (nothing committed since its hit,
  tokens allocated and not committed, a plan in flight or failed) is refused
  and nothing changes;
- while the step is in flight: every page the request owns is its own, no
  other request's `match` can return a draft token (the machine's hit bounds
  hold), `allocate` / `commit` / `append_tokens` are refused unchanged;
- meanwhile eviction, or another request serving exactly the verified tokens
  followed by the drafts (so the drafted prefix gets published by someone
  else), may run;
- the step's checkpoint copy (the working tail into its first tail page) must
  complete before `accept`, `reject` or `release`, which refuse unchanged;
- `reject` (or accepting nothing past the committed tokens) gives the request
  back exactly its tables, pins, owned pages and counts, and (with nothing
  else run meanwhile, and nothing evicted by `propose` to make room) every
  page pool exactly its free pages;
- `accept(n)` leaves the request holding the tables an allocation of the same
  tokens holds on a clone that never speculated (same lengths, same pages
  released, same number of owned pages per pool), and the same watermarks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, rule

from hkv_core.errors import AdmissionRejected, HkvError
from hkv_core.manager import CacheManager, InvalidRequestState, OutOfPages
from hkv_core.plan import Completion
from hkv_core.testing.machine_model import Committed, evictions

INTERLEAVE = ("nothing", "evict", "publish_drafted_prefix")


def request_view(m: CacheManager, rid: int) -> tuple[Any, ...]:
    """Everything the manager says about one request."""
    tables = {pool: list(pages) for pool, pages in m.tables(rid).items()}
    return (m.request_tokens(rid), tables, m.owned(rid), m.pinned(rid), m.chain(rid))


def shape_view(m: CacheManager, rid: int) -> tuple[Any, ...]:
    """A request's tables up to page identity: per pool, which entries are NULL and how many pages it owns."""
    tables = {pool: [page != 0 for page in pages] for pool, pages in m.tables(rid).items()}
    owned = {pool: len(pages) for pool, pages in m.owned(rid).items()}
    return m.request_tokens(rid), tables, owned, m.chain(rid)


class DraftRules:
    """Mixed into ManagerMachine (which provides the model, the manager and the other rules)."""

    requests: Bundle[int] = Bundle("requests")

    @rule(rid=requests, k=st.integers(1, 9), accepted=st.integers(-1, 9), interleave=st.sampled_from(INTERLEAVE),
          seed=st.integers(0, 3))
    def speculate(self, rid: int, k: int, accepted: int, interleave: str, seed: int) -> None:
        machine: Any = self
        m: CacheManager = machine.manager
        req = machine.model[rid]
        drafts = np.random.default_rng(300 + seed).integers(0, 1000, k).astype(np.int64)
        able = req.acquired and req.allocated == req.computed > req.hit_tokens and not req.plans and not req.failed
        before, view = m.snapshot(), request_view(m, rid)
        free, evicted = {name: m.free_pages(name) for name in machine.pool_pages}, evictions(m)
        twin = m.clone()
        try:
            alloc = m.propose(rid, drafts)
        except HkvError as err:
            assert not able or isinstance(err, AdmissionRejected), f"propose refused a request that may: {err}"
            machine._expect_unchanged(before, "a refused propose")
            return
        assert able, "propose accepted a request that may not speculate"
        if alloc.plan is not None:  # the checkpoint copy: accept and reject wait for it
            self._plan_first(rid, alloc.plan.plan_id)
        self._in_flight(rid)
        if interleave == "evict":
            machine.evict(None)
        elif interleave == "publish_drafted_prefix":
            self._publish_elsewhere(np.concatenate([req.tokens, drafts]), req.salt)
        if accepted < 0:
            m.reject(rid)
            end = req.computed
        else:
            n = min(accepted, k)
            m.accept(rid, n)
            req.tokens = np.concatenate([req.tokens, drafts[:n]]).astype(np.int64)
            end = len(req.tokens)
        req.allocated = end
        if end == req.computed and len(req.tokens) == view[0][2]:
            assert request_view(m, rid) == view, "a rejected step changed the request"
            if interleave == "nothing" and evictions(m) == evicted:  # (propose may evict to make room, as
                assert {name: m.free_pages(name) for name in free} == free, "a rejected step kept pages"  # allocate)
        else:
            self._like_an_allocation(twin, rid, req.tokens[view[0][2]:], end - req.computed)

    def _plan_first(self, rid: int, plan_id: int) -> None:
        """accept and reject refuse (changing nothing) while the step's copy is in flight; then it completes."""
        machine: Any = self
        m: CacheManager = machine.manager
        before = m.snapshot()
        calls: list[Callable[[], None]] = [lambda: m.accept(rid, 0), lambda: m.reject(rid), lambda: m.release(rid)]
        for call in calls:
            try:
                call()
            except InvalidRequestState:
                machine._expect_unchanged(before, "a call refused while a step's copy is in flight")
            else:
                raise AssertionError("a step was settled while its copy was in flight")
        m.complete(plan_id, Completion())

    def _in_flight(self, rid: int) -> None:
        machine: Any = self
        m: CacheManager = machine.manager
        for pool, pages in m.owned(rid).items():
            states = m.pages(pool, pages).states
            assert all(s in ("AHEAD", "RESERVED", "DRAFT", "FILLING") for s in states), (pool, states)
        before = m.snapshot()
        for call in (lambda: m.allocate(rid, 1), lambda: m.commit(rid, 1), lambda: m.append_tokens(rid, [1])):
            try:
                call()
            except InvalidRequestState:
                machine._expect_unchanged(before, "a call refused during a speculative step")
            else:
                raise AssertionError("a call that needs no step in flight succeeded during one")

    def _publish_elsewhere(self, tokens: np.ndarray, salt: str | None) -> None:
        """Another request serves (and publishes) exactly the verified tokens and the drafts."""
        machine: Any = self
        m: CacheManager = machine.manager
        if len(machine.model) >= machine.config.max_requests:
            return
        try:
            other = m.add_request(tokens, cache_salt=salt)
        except HkvError:
            return
        try:
            hit = m.match(other)
            m.acquire(other, hit)
            alloc = m.allocate(other, len(tokens) - hit.tokens)
            if alloc.plan is not None:
                m.complete(alloc.plan.plan_id, Completion())
            m.commit(other, len(tokens) - hit.tokens)
        except OutOfPages:
            m.release(other)
            return
        machine.committed[other] = Committed(salt=salt, tokens=tokens.copy(), start=hit.tokens,
                                             prompt_tokens=len(tokens), evictions=evictions(m),
                                             junction=hit.candidate_tokens if hit.candidate_tokens > hit.tokens else 0)
        m.release(other)
        machine.released.add(other)
        machine.committed[other] = attrs.evolve(machine.committed[other], released=True)

    def _like_an_allocation(self, twin: CacheManager, rid: int, accepted: np.ndarray, count: int) -> None:
        """The request holds what allocating the same tokens holds on a manager that never speculated."""
        machine: Any = self
        if len(accepted):
            twin.append_tokens(rid, accepted)
        try:
            twin.allocate(rid, count)
        except OutOfPages:
            return  # the twin did not evict for the step: its pools may be fuller
        assert shape_view(machine.manager, rid) == shape_view(twin, rid), "an accepted step differs from an allocation"
