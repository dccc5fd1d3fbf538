"""The manager state machine's rules for slots reserved ahead of the known tokens (docs/manager.md).

`allocate_ahead` reserves positions past the request's known tokens (the
slots a scheduler hands out for tokens not sampled yet); the rule then
checks that a commit past the known tokens is refused with nothing changed,
and, when it appends the tokens that make the positions known, that every
page id of the request's tables stays what the allocation handed out (an
engine wrote them into its block tables).  A later `commit` (the machine's
own rule) publishes them; `release` frees what is still unverified.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, rule

from hkv_core.manager import CacheManager, InvalidRequestState, OutOfPages

VOCAB_TOKENS = 1000


class AheadRules:
    """Mixed into ManagerMachine (which provides the model, the manager and `_check_allocation`)."""

    requests: Bundle[int] = Bundle("requests")

    @rule(rid=requests, count=st.integers(1, 9), append=st.booleans(), seed=st.integers(0, 3))
    def allocate_ahead(self, rid: int, count: int, append: bool, seed: int) -> None:
        machine: Any = self
        m: CacheManager = machine.manager
        req = machine.model[rid]
        before = m.snapshot()
        try:
            alloc = m.allocate_ahead(rid, count)
        except (InvalidRequestState, OutOfPages):
            machine._expect_unchanged(before, "a refused allocate_ahead")
            return
        req.acquired, req.allocated = True, req.allocated + count
        machine._started(req)
        machine._check_allocation(rid, alloc)
        if alloc.plan is not None:
            machine.in_flight[alloc.plan.plan_id] = (rid, alloc.plan)
            req.plans.add(alloc.plan.plan_id)
            machine._complete(alloc.plan.plan_id)
        self._refuse_commit_past_known(rid)
        if append and req.allocated > len(req.tokens):
            tables = m.tables(rid)
            more = np.random.default_rng(400 + seed).integers(0, VOCAB_TOKENS, req.allocated - len(req.tokens))
            m.append_tokens(rid, more)
            req.tokens = np.concatenate([req.tokens, more]).astype(np.int64)
            assert m.tables(rid) == tables, "append_tokens moved a page of a slot reserved ahead"

    def _refuse_commit_past_known(self, rid: int) -> None:
        machine: Any = self
        m: CacheManager = machine.manager
        req = machine.model[rid]
        if req.allocated <= len(req.tokens) or req.plans or req.failed:
            return
        before = m.snapshot()
        try:
            m.commit(rid, req.allocated - req.computed)
        except InvalidRequestState:
            machine._expect_unchanged(before, "a commit past the known tokens")
        else:
            raise AssertionError("a commit past the known tokens succeeded")
