"""Speculative steps (docs/drafts.md): the API's refusals, exact rollback, and each draft check shown able to fail.

The state machine (tests/stateful/test_manager_machine.py) runs steps on every
bound layout through hkv_core.testing.draft_rules; here each check it and
`check_invariants` rely on is broken on purpose and must catch it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from hkv_core import CacheManager, Layout, ManagerConfig, check_invariants
from hkv_core.errors import AdmissionRejected, InvalidRequestArgument, InvalidRequestState, InvalidTokens
from hkv_core.manager import draft as draft_module
from hkv_core.manager.core import Core
from hkv_core.manager.records import Allocation
from hkv_core.manager.requests import RequestState
from hkv_core.manager.roles import Moves, TailRole
from hkv_core.manager.roles.base import Role
from hkv_core.plan import Completion
from hkv_core.testing.draft_rules import request_view
from hkv_core.testing.manager_machine import make_manager_machine

PROMPT = (np.arange(37) * 7 + 3) % 60


def decoding(**config: Any) -> tuple[CacheManager, int]:
    """A tiny_v4 manager with one request that computed its prompt and holds one verified token more."""
    m = CacheManager(Layout.from_preset("tiny_v4"),
                     ManagerConfig(**{"default_pool_pages": 48, "retain_every_blocks": 1, "key_seed": 0, **config}))
    rid = m.add_request(PROMPT)
    m.acquire(rid, m.match(rid))
    m.allocate(rid, len(PROMPT))
    m.commit(rid, len(PROMPT))
    m.append_tokens(rid, [9])
    return m, rid


def step(m: CacheManager, rid: int, drafts: Any) -> Allocation:
    """propose, then complete its checkpoint copy (an executor would run it)."""
    alloc = m.propose(rid, drafts)
    if alloc.plan is not None:
        m.complete(alloc.plan.plan_id, Completion())
    return alloc


def free(m: CacheManager) -> dict[str, int]:
    return {b.spec.name: m.free_pages(b.spec.name) for b in m.bindings()}


# ------------------------------------------------------------------ the API

def test_reject_returns_exactly_the_state_before_propose() -> None:
    m, rid = decoding()
    view, pages = request_view(m, rid), free(m)
    alloc = step(m, rid, [1, 2, 3, 4, 5, 6, 7, 8])
    assert alloc.start_tokens == len(PROMPT) and alloc.num_tokens == 9 and alloc.draft_tokens == 8
    assert free(m) != pages and check_invariants(m) == []
    m.reject(rid)
    assert request_view(m, rid) == view and free(m) == pages and check_invariants(m) == []


@pytest.mark.parametrize("accepted", range(9))
def test_accept_holds_what_an_allocation_of_the_same_tokens_holds(accepted: int) -> None:
    m, rid = decoding()
    twin = m.clone()
    drafts = [1, 2, 3, 4, 5, 6, 7, 8]
    step(m, rid, drafts)
    m.accept(rid, accepted)
    twin.append_tokens(rid, drafts[:accepted])
    twin.allocate(rid, 1 + accepted)
    for one in (m, twin):
        one.commit(rid, 1 + accepted)
    assert m.request_tokens(rid) == twin.request_tokens(rid) == (38 + accepted,) * 3
    assert {p: len(t) for p, t in m.tables(rid).items()} == {p: len(t) for p, t in twin.tables(rid).items()}
    assert {p: len(o) for p, o in m.owned(rid).items()} == {p: len(o) for p, o in twin.owned(rid).items()}
    assert m.chain(rid) == twin.chain(rid) and m.index_counts() == twin.index_counts()
    assert free(m) == free(twin) and check_invariants(m) == []


def test_the_working_tail_is_checkpointed_by_a_plan_copy() -> None:
    """The step's first tail page starts as a copy of the working tail (a plan op the executor runs and
    `verify` passes: a request's plans may read its own working pages); accept and reject wait for it."""
    m, rid = decoding()
    alloc = m.propose(rid, [1, 2, 3])  # 38 -> 41: tails of ends 39..41 start where the working tail starts
    assert alloc.plan is not None
    working = set(alloc.tail_pages.values())
    first = {pool: alloc.draft_tails[39][pool] for pool in alloc.tail_pages}
    assert {op.src for op in alloc.plan.ops} == working and {(op.pool, op.dst) for op in alloc.plan.ops} <= set(
        first.items())
    before = m.snapshot()
    for call in (lambda: m.accept(rid, 1), lambda: m.reject(rid), lambda: m.release(rid)):
        with pytest.raises(InvalidRequestState, match="in flight"):
            call()
    assert m.snapshot() == before
    m.verify(alloc.plan)
    m.complete(alloc.plan.plan_id, Completion())
    m.accept(rid, 3)
    assert check_invariants(m) == []


def test_a_failed_checkpoint_copy_leaves_only_reject() -> None:
    m, rid = decoding()
    view = request_view(m, rid)
    alloc = m.propose(rid, [1, 2, 3])
    assert alloc.plan is not None
    m.complete(alloc.plan.plan_id, Completion(ok=False, error="test: copy failed"))
    with pytest.raises(InvalidRequestState, match="reject the step"):
        m.accept(rid, 2)
    m.reject(rid)
    assert request_view(m, rid) == view and check_invariants(m) == []
    step(m, rid, [4, 5])  # the failure went with the step: the request speculates again
    m.accept(rid, 2)
    m.commit(rid, 3)


def test_no_draft_token_is_ever_keyed_indexed_or_matched() -> None:
    m, rid = decoding()
    drafts = (np.arange(30) * 11 + 1) % 60
    step(m, rid, drafts[:9])
    other = m.add_request(np.concatenate([PROMPT, [9], drafts[:9]]))
    assert m.match(other).tokens <= len(PROMPT)  # nothing past the verified tokens, whatever the drafts are
    assert len(m.core.requests.by_rid[rid].keys) == (len(PROMPT) + 1) // m.layout.block_tokens
    m.accept(rid, 9)
    m.commit(rid, 10)
    assert m.match(other).tokens > len(PROMPT)  # once verified and committed, they are cached like any token


def test_events_report_no_draft_token() -> None:
    """A step reports nothing; accepted drafts are reported once committed, like any token (KV events)."""
    m, rid = decoding(kv_events=True)
    m.take_events()
    step(m, rid, [1, 2, 3, 4, 5, 6, 7, 8])
    assert m.take_events() == []
    m.reject(rid)
    assert m.take_events() == []
    step(m, rid, [1, 2, 3, 4, 5, 6, 7, 8])
    m.accept(rid, 8)
    assert m.take_events() == []
    m.commit(rid, 9)
    stored = [e for e in m.take_events() if type(e).__name__ == "BlockStored"]
    bt = m.layout.block_tokens
    assert sum(len(e.block_hashes) for e in stored) == 47 // bt - 38 // bt  # the one block the 9 tokens completed


def test_release_during_a_step_frees_it() -> None:
    m, rid = decoding()
    step(m, rid, [1, 2, 3, 4, 5])
    m.release(rid)
    m.evict()
    assert all(n == b.pages - 1 for b, n in zip(m.bindings(), free(m).values(), strict=True))
    assert check_invariants(m) == []


@pytest.mark.parametrize(("call", "error"), [
    (lambda m, r: m.propose(r, []), InvalidRequestArgument),
    (lambda m, r: m.propose(r, [1.5, 2.0]), InvalidTokens),
    (lambda m, r: m.propose(r, [[1, 2]]), InvalidTokens),
    (lambda m, r: m.propose(r, [-1]), InvalidTokens),
    (lambda m, r: m.propose(r, np.zeros(40, np.int64)), AdmissionRejected),
    (lambda m, r: m.accept(r, 1), InvalidRequestState),
    (lambda m, r: m.reject(r), InvalidRequestState),
])
def test_bad_calls_change_nothing(call: Any, error: type[Exception]) -> None:
    m, rid = decoding(max_request_tokens=64)
    before = m.snapshot()
    with pytest.raises(error):
        call(m, rid)
    assert m.snapshot() == before


@pytest.mark.parametrize("action", ["allocate", "commit", "append_tokens", "propose", "accept_too_many",
                                    "accept_bool"])
def test_calls_during_a_step_are_refused_unchanged(action: str) -> None:
    m, rid = decoding()
    step(m, rid, [1, 2, 3])
    before = m.snapshot()
    calls = {"allocate": lambda: m.allocate(rid, 1), "commit": lambda: m.commit(rid, 1),
             "append_tokens": lambda: m.append_tokens(rid, [1]), "propose": lambda: m.propose(rid, [1]),
             "accept_too_many": lambda: m.accept(rid, 4), "accept_bool": lambda: m.accept(rid, True)}
    with pytest.raises((InvalidRequestState, InvalidRequestArgument)):
        calls[action]()
    assert m.snapshot() == before


def test_a_step_needs_a_committed_token_since_the_hit() -> None:
    m = CacheManager(Layout.from_preset("tiny_v4"), ManagerConfig(default_pool_pages=48, key_seed=0))
    rid = m.add_request(PROMPT)
    with pytest.raises(InvalidRequestState):
        m.propose(rid, [1])  # not acquired
    m.acquire(rid, m.match(rid))
    m.allocate(rid, 8)
    with pytest.raises(InvalidRequestState):
        m.propose(rid, [1])  # tokens allocated and not committed
    m.commit(rid, 8)
    step(m, rid, [1])


# ------------------------------------------------------- each check can fail

def test_invariants_catch_drafts_hashed_into_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: propose appends the drafts to the request's tokens (they get block keys)."""
    real = draft_module.propose

    def hashing(core: Core, req: RequestState, tokens: np.ndarray) -> Any:
        found = real(core, req, tokens)
        draft_module.admit.append_tokens(core, req, tokens)
        return found

    monkeypatch.setattr(draft_module, "propose", hashing)
    m, rid = decoding()
    step(m, rid, [1, 2, 3, 4, 5, 6, 7])
    assert any("draft_isolation" in v and "verified" in v for v in check_invariants(m))


def test_invariants_catch_a_step_that_leaks_its_drafts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: settling a step forgets to reject what was not accepted."""
    real_step = draft_module.Moves.take

    def no_reject(self: Moves, event: Any) -> Any:
        found = real_step(self, event)
        return found[:0] if event == "reject" else found

    monkeypatch.setattr(draft_module.Moves, "take", no_reject)
    m, rid = decoding()
    step(m, rid, [1, 2, 3, 4, 5, 6, 7, 8])
    m.accept(rid, 0)
    broken = check_invariants(m)
    assert any(v.startswith("draft_isolation") and "exactly" in v for v in broken), broken


def test_invariants_catch_a_step_that_keeps_its_index_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: settling keeps every index row the step reserved, used or not (F15)."""
    real = draft_module._blocks_needed

    def keep_all(core: Core, req: RequestState, end: int) -> int:
        return req.draft.blocks if req.draft is not None else real(core, req, end)

    monkeypatch.setattr(draft_module, "_blocks_needed", keep_all)
    m, rid = decoding()
    step(m, rid, [1, 2, 3, 4, 5, 6, 7, 8])  # tokens up to 46: one block more than the 4 committed
    m.accept(rid, 0)
    assert any(v.startswith("no_slot_leak") and "reserves 1 block" in v for v in check_invariants(m))


def _machine_fails(monkeypatch: pytest.MonkeyPatch, symptom: str) -> None:
    machine = make_manager_machine("tiny_v4", default_pool_pages=48, retain_every_blocks=1)
    quick = settings(max_examples=800, stateful_step_count=30, database=None, phases=[Phase.generate],
                     report_multiple_bugs=False, print_blob=False, derandomize=True)
    with pytest.raises(Exception, match=symptom):
        run_state_machine_as_test(machine, settings=quick)


def test_machine_catches_a_reject_that_moves_the_working_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: a rejected step still makes its first tail page the working tail."""
    real = TailRole.settle_draft

    def keep_first(self: TailRole, req: RequestState, draft: Any, end: int, moves: Moves) -> None:
        real(self, req, draft, end if end > draft.start else draft.verified + 1, moves)

    monkeypatch.setattr(TailRole, "settle_draft", keep_first)
    _machine_fails(monkeypatch, "a rejected step changed the request|invariant violated")


def test_machine_catches_an_accept_that_keeps_rejected_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken variant: accepting keeps every page the step added to the tables (F15: reserved for nothing)."""

    def keep_all(self: Role, req: RequestState, draft: Any, end: int, moves: Moves) -> None:
        for pool in self.pools:
            moves.add(draft_module.Event.ACCEPT, req.tables[pool.index].objs[draft.table_lens[pool.index]:]
                      .astype(np.intp))

    monkeypatch.setattr(Role, "settle_draft", keep_all)
    _machine_fails(monkeypatch, "differs from an allocation|invariant violated|a rejected step")


def test_machine_example_propose_evicts_to_make_room() -> None:
    """Found by the state machine: propose may evict (as allocate does) when the pools are full, so a rejected
    step gives the request back its state but the cache keeps what eviction freed; the rule allows that."""
    machine = make_manager_machine("tiny_v4", default_pool_pages=24, retain_every_blocks=2, max_requests=4)()
    machine.warm_up(cold=0, salt=None)
    machine.serve_request(salt=None, suffix_seed=0, suffix_steps=32, system=0)
    machine.serve_request(salt=None, suffix_seed=0, suffix_steps=28, system=2)
    rid = machine.add_request(salt=None, suffix_seed=0, suffix_steps=0, system=0)
    machine.schedule_step(kind=1, scaled=1, units=1)
    before = machine.manager.stats["evicted_blocks"] + machine.manager.stats["evicted_points"]
    machine.speculate(rid=rid, k=1, accepted=0, interleave="nothing", seed=0)
    assert machine.manager.stats["evicted_blocks"] + machine.manager.stats["evicted_points"] > before
    machine.state_is_consistent()
    machine.teardown()
