"""CacheManager: the object an inference engine's scheduler calls for every request.

    rid = manager.add_request(tokens, cache_salt="tenant-a")
    hit = manager.match(rid)               # longest safe resume point + verdict
    manager.acquire(rid, hit)              # re-check against the index (StaleLease), pin
    alloc = manager.allocate(rid, n)       # pages + slot mappings + copy plan (OutOfPages: nothing changed)
    # (allocate_ahead(rid, n): also positions past the known tokens, reserved ahead until append_tokens)
    if alloc.plan: manager.complete(alloc.plan.plan_id, executor.run(alloc.plan))
    ...engine writes the KV of n tokens...
    manager.commit(rid, n)                 # publish complete pages and resume points
    manager.release(rid)                   # unpin, free what the request owned

Every public method takes one lock; the manager is safe to share between
threads.  Every argument is checked before anything changes: a failing call
raises a typed HkvError and leaves the manager as it was.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hkv_core.block_keys import ExtraKeys, checked_tokens
from hkv_core.errors import (
    CacheBusy,
    ConfigError,
    InvalidArgument,
    InvalidRequestArgument,
    InvalidRequestState,
    InvariantViolation,
    StaleLease,
    UnknownPlan,
    UnknownRequest,
)
from hkv_core.events import KVEvent
from hkv_core.executor import PoolBinding
from hkv_core.layout import Layout
from hkv_core.manager import (
    acquire,
    admit,
    allocate,
    commit,
    draft,
    evict,
    interrupts,
    match,
    record_plans,
    release,
    retention,
    views,
)
from hkv_core.manager.config import ManagerConfig
from hkv_core.manager.core import Core
from hkv_core.manager.index.eviction import PolicyFactory
from hkv_core.manager.invariants import check_invariants
from hkv_core.manager.lanes import managed_pools
from hkv_core.manager.page_pools import NO_OWNER
from hkv_core.manager.records import Allocation, Hit
from hkv_core.manager.requests import DraftState, RequestState
from hkv_core.plan import Completion, Plan, RecordRows
from hkv_core.spec.names import Event
from hkv_core.units import as_count

P = ParamSpec("P")
R = TypeVar("R")


def _locked(method: Callable[P, R]) -> Callable[P, R]:
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        self = args[0]
        assert isinstance(self, CacheManager)
        with self._lock:
            deferring = interrupts.defer()  # a Ctrl-C lands before the call or after all of it (interrupts.py)
            try:
                result = method(*args, **kwargs)
                if self.core.config.debug_checks:
                    self._assert_invariants(method.__name__)
            finally:
                if deferring:
                    interrupts.resume()  # runs the handler of a signal that arrived meanwhile (KeyboardInterrupt)
            return result

    return functools.update_wrapper(run, method)  # name, docstring and signature (__wrapped__) of the method


class CacheManager:
    """Prefix index, hit validation, leases, allocation, copy plans and eviction over static pools."""

    def __init__(self, layout: Layout, config: ManagerConfig | None = None, *,
                 eviction_policy: PolicyFactory | None = None) -> None:
        """InvalidArgument when `layout` is not a Layout or `config` is neither None nor a ManagerConfig.

        The eviction policy is `config.eviction`'s ("lru" or "adaptive"); `eviction_policy`, a factory
        `(block_rows, block_keys) -> EvictionPolicy` (hkv_core.manager.index.eviction), runs another one
        instead (the replay's offline Belady optimum)."""
        if not isinstance(layout, Layout):
            raise InvalidArgument(action="CacheManager", argument="layout", value=layout,
                                  reason=f"must be a hkv_core.layout.Layout (Layout.from_preset, Layout.from_hf_config)"
                                         f", got {type(layout).__name__}")
        if config is not None and not isinstance(config, ManagerConfig):
            raise InvalidArgument(action="CacheManager", argument="config", value=config,
                                  reason=f"must be None or a ManagerConfig, got {type(config).__name__}")
        if eviction_policy is not None and not callable(eviction_policy):
            raise InvalidArgument(action="CacheManager", argument="eviction_policy", value=eviction_policy,
                                  reason="must be None or a callable (block_rows, block_keys) -> EvictionPolicy")
        self.core = Core(layout, config if config is not None else ManagerConfig(), eviction_policy=eviction_policy)
        self._lock = threading.RLock()

    def clone(self) -> CacheManager:
        """An independent manager with a copy of this one's whole state (for model checking and tests)."""
        with self._lock:
            twin = CacheManager.__new__(CacheManager)
            twin.core, twin._lock = self.core.clone(), threading.RLock()
            return twin

    @property
    def layout(self) -> Layout:
        return self.core.layout

    @property
    def config(self) -> ManagerConfig:
        return self.core.config

    @property
    def stats(self) -> dict[str, int]:
        """Counters: evicted blocks / points, eviction rounds, copies issued."""
        return dict(self.core.stats)

    # ------------------------------------------------------------------ requests

    @_locked
    def add_request(self, tokens: ArrayLike, *, cache_salt: str | None = None, lora_id: str | int | None = None,
                    mm_keys: tuple[tuple[int, bytes], ...] = ()) -> int:
        """Register a request and hash its prompt; AdmissionRejected past `max_requests`, InvalidTokens for a
        prompt that is empty or not a 1-D array of token ids, InvalidArgument for a bad salt, adapter or item."""
        try:
            extra = ExtraKeys(cache_salt=cache_salt, lora_id=lora_id, mm_keys=mm_keys)
        except ConfigError as exc:  # name add_request's argument, not the record it builds
            given = {"cache_salt": cache_salt, "lora_id": lora_id, "mm_keys": mm_keys}
            raise InvalidArgument(action="add_request", argument=exc.key, value=given.get(exc.key),
                                  reason=exc.reason) from None
        return admit.add_request(self.core, tokens, extra)

    @_locked
    def append_tokens(self, rid: int, tokens: ArrayLike) -> None:
        """Extend a request (decode) with verified tokens: new complete blocks get chained keys."""
        req = self._request(rid, "append_tokens")
        self._no_draft(req, "append_tokens")
        admit.append_tokens(self.core, req, tokens)

    @_locked
    def match(self, rid: int, *, max_tokens: int | None = None) -> Hit:
        """The longest safe resume point for the request, with the verdict of every layer; with `max_tokens`,
        the longest at or below it (an engine that recomputes the last block, as EAGLE drafting needs).
        InvalidRequestArgument for a `max_tokens` that is not an int >= 0 (nothing changed)."""
        req = self._request(rid, "match")
        if req.acquired:
            raise InvalidRequestState(request_id=rid, action="match", reason=self._acquired_why(req))
        if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 0):
            raise InvalidRequestArgument(request_id=rid, action="match", argument="max_tokens", value=max_tokens,
                                         reason="must be None or an int >= 0")
        return match.match(self.core, req, max_tokens)

    @_locked
    def acquire(self, rid: int, found: Hit) -> None:
        """Pin the hit's objects after re-checking it against the index (StaleLease if anything moved)."""
        req = self._request(rid, "acquire")
        if not isinstance(found, Hit):
            raise InvalidRequestArgument(request_id=rid, action="acquire", argument="hit", value=found,
                                         reason=f"must be the Hit that match returned, got {type(found).__name__}")
        if req.acquired:
            raise InvalidRequestState(request_id=rid, action="acquire", reason=self._acquired_why(req))
        if found.request_id != rid:
            raise InvalidRequestArgument(request_id=rid, action="acquire", argument="hit", value=found,
                                         reason=f"a hit of request {found.request_id}, not of request {rid}")
        if found.tokens != len(found.block_ids) * self.core.block_tokens or found.tokens >= max(1, len(req.tokens)):
            raise InvalidRequestArgument(request_id=rid, action="acquire", argument="hit", value=found,
                                         reason=f"a hit of {found.tokens} tokens over {len(found.block_ids)} blocks "
                                                f"does not fit this request's {len(req.tokens)} tokens")
        acquire.acquire(self.core, req, found)

    @_locked
    def can_allocate(self, rid: int, num_tokens: int) -> bool:
        """True when `allocate(rid, num_tokens)` would succeed without evicting; a count `allocate` would refuse
        raises the same InvalidRequestArgument (checked in O(1), before anything is counted)."""
        req = self._request(rid, "can_allocate")
        self._no_draft(req, "can_allocate")
        count = self._count(req, "can_allocate", num_tokens, len(req.tokens) - req.allocated)
        demands, blocks, points, _ = allocate.needs(self.core, req, req.allocated, req.allocated + count)
        return allocate.fits(self.core, [d[0] for d in demands], blocks, points)

    @_locked
    def allocate(self, rid: int, num_tokens: int) -> Allocation:
        """Pages, slot mappings and the copy plan for the next tokens; OutOfPages leaves everything as it was."""
        req = self._request(rid, "allocate")
        self._no_draft(req, "allocate")
        count = self._count(req, "allocate", num_tokens, len(req.tokens) - req.allocated)
        return allocate.allocate(self.core, req, count)

    @_locked
    def allocate_ahead(self, rid: int, num_tokens: int, step_start: int | None = None) -> Allocation:
        """Pages, slot mappings and the copy plan for positions [allocated, allocated + num_tokens), also past the
        request's known tokens: slots for tokens not known yet (speculative lookahead, async scheduling).

        Positions at or past the known tokens are *reserved ahead* (objects AHEAD): nothing covering them is
        hashed, indexed, published, kept as a resume point or served to another request until `append_tokens`
        makes them known (verified) and `commit` covers them (written).  Their pages never change while the
        request lives.  `release` frees what is still unverified.  InvalidRequestArgument past
        `max_request_tokens` (nothing changed); OutOfPages leaves everything as it was.

        `step_start`: where the engine's step these slots serve begins, in [committed, allocated] (an engine that
        says it lets state columns keep a point inside a column on a snapshot: roles/state.py)."""
        req = self._request(rid, "allocate_ahead")
        self._no_draft(req, "allocate_ahead")
        count = self._count(req, "allocate_ahead", num_tokens, self.core.config.max_request_tokens - req.allocated)
        if step_start is not None and (isinstance(step_start, bool) or not isinstance(step_start, int | np.integer)
                                       or not req.computed <= step_start <= req.allocated):
            raise InvalidRequestArgument(request_id=rid, action="allocate_ahead", argument="step_start",
                                         value=step_start, reason=f"must be an integer in [{req.computed}, "
                                                                  f"{req.allocated}] (committed, allocated)")
        return allocate.allocate(self.core, req, count, -1 if step_start is None else int(step_start))

    @_locked
    def commit(self, rid: int, num_tokens: int) -> None:
        """The engine wrote `num_tokens` more tokens: publish what became complete.  Only known tokens commit:
        `num_tokens` lies in [1, min(allocated, known) - committed] (slots reserved ahead wait for
        `append_tokens`)."""
        req = self._request(rid, "commit")
        self._no_draft(req, "commit")
        count = self._count(req, "commit", num_tokens, min(req.allocated, len(req.tokens)) - req.computed)
        self._no_plans(req, "commit")
        commit.commit(self.core, req, count)

    @_locked
    def release(self, rid: int) -> None:
        """End the request: keep what the index can use, unpin, free its private pages, forget it."""
        req = self._request(rid, "release")
        self._no_plans(req, "release")
        if req.draft is not None:
            draft.settle(self.core, req, req.draft.start)
        release.release(self.core, req)

    # ------------------------------------------------------------------ speculative steps (docs/drafts.md)

    @_locked
    def propose(self, rid: int, draft_tokens: ArrayLike) -> Allocation:
        """Reserve a speculative step: the verified tokens not yet computed, then `draft_tokens` (unverified:
        no key, block, resume point or event covers them until `accept`).  The Allocation says where the step
        writes (`draft_tails` for the compressor tails); OutOfPages leaves everything as it was.

        InvalidRequestState unless the request computed a token since its hit, has no tokens allocated and
        uncommitted, no plan in flight and no step in flight; InvalidTokens / InvalidRequestArgument for bad
        or no draft tokens; AdmissionRejected past `max_request_tokens`."""
        req = self._request(rid, "propose")
        self._no_draft(req, "propose")
        self._no_plans(req, "propose")
        if not req.acquired or req.computed <= req.hit_tokens or req.allocated != req.computed:
            raise InvalidRequestState(request_id=rid, action="propose",
                                      reason=f"a step starts after a committed token: {req.computed} committed "
                                             f"(hit {req.hit_tokens}), {req.allocated} allocated")
        tokens = checked_tokens(admit.as_token_array(draft_tokens)).astype(np.int64)
        if not tokens.size:
            raise InvalidRequestArgument(request_id=rid, action="propose", argument="draft_tokens",
                                         value=draft_tokens, reason="a step proposes at least one draft token")
        admit.check_length(self.core, len(req.tokens) + len(tokens))
        return draft.propose(self.core, req, tokens)

    @_locked
    def accept(self, rid: int, num_accepted: int) -> None:
        """The target verified the first `num_accepted` draft tokens (0 <= num_accepted <= k): they join the
        request's tokens; the step's state past them is freed, the rest becomes the request's own, exactly as
        if it had allocated those tokens.  Commit them next (`commit(rid, n)`, n = what `request_tokens`
        shows allocated and not committed)."""
        req = self._request(rid, "accept")
        step = self._draft(req, "accept")
        self._no_plans(req, "accept")
        count = num_accepted
        if isinstance(count, bool) or not isinstance(count, int | np.integer) or not 0 <= count <= len(step.tokens):
            raise InvalidRequestArgument(request_id=rid, action="accept", argument="num_accepted", value=count,
                                         reason=f"must be an integer in [0, {len(step.tokens)}] (the draft tokens)")
        draft.settle(self.core, req, step.verified + int(count))

    @_locked
    def reject(self, rid: int) -> None:
        """Drop the step entirely: the request is exactly as before `propose` (its verified tokens stay known,
        not allocated)."""
        req = self._request(rid, "reject")
        step = self._draft(req, "reject")
        self._no_plans(req, "reject")
        draft.settle(self.core, req, step.start)

    @_locked
    def evict(self, max_units: int | None = None) -> int:
        """Evict unpinned resume points and leaf blocks, LRU first; returns units evicted."""
        if max_units is not None:
            max_units = as_count("max_units", max_units)
        return evict.evict_all(self.core, max_units)

    @_locked
    def request_tokens(self, rid: int) -> tuple[int, int, int]:
        """(computed, allocated, known) tokens of a request."""
        req = self._request(rid, "request_tokens")
        return req.computed, req.allocated, len(req.tokens)

    # ------------------------------------------------------------------ plans and executors

    def bindings(self) -> tuple[PoolBinding, ...]:
        """Every pool an executor allocates, in layout order, sized like its page pool's page ids (NULL page
        included; with a shared block space, every block of the space)."""
        core = self.core
        return tuple(PoolBinding(spec=spec, pages=core.member[spec.name].spec.slots)
                     for spec in managed_pools(core.layout, core.config))

    @_locked
    def verify(self, plan: Plan) -> None:
        """StaleLease unless every page `plan` reads is still the placement of the object at the version it
        recorded (what an executor calls at launch, under this manager's lock); InvalidArgument when `plan` is
        not a Plan."""
        if not isinstance(plan, Plan):
            raise InvalidArgument(action="verify", argument="plan", value=plan,
                                  reason=f"must be a hkv_core.plan.Plan, got {type(plan).__name__}")
        owner = self.core.requests.by_rid.get(plan.request_id)
        actor = owner.slot if owner is not None else NO_OWNER
        for check in plan.checks():
            pool = self.core.member.get(check.pool)
            ok, found, state = (self.core.objects.check_page(pool.index, check.page, check.version, actor,
                                                                         check.writes) if pool
                                else (False, -1, "NO_POOL"))
            if not ok:
                raise StaleLease(pool=check.pool, page=check.page, expected_version=check.version,
                                 found_version=found, request_id=plan.request_id, found_state=state)

    @_locked
    def complete(self, plan_id: int, completion: Completion) -> None:
        """An executor finished plan `plan_id`: its copies' targets leave FILLING (copy_done, or copy_fail).

        UnknownPlan for a plan id not in flight; InvalidArgument when `completion` is not a Completion (the
        plan stays in flight: nothing changed)."""
        record = (self.core.plans.get(int(plan_id))
                  if isinstance(plan_id, int | np.integer) and not isinstance(plan_id, bool) else None)
        if record is None:
            raise UnknownPlan(plan_id=plan_id, action="complete")
        if not isinstance(completion, Completion):
            raise InvalidArgument(action="complete", argument="completion", value=completion,
                                  reason=f"must be the hkv_core.plan.Completion the executor returned, got "
                                         f"{type(completion).__name__}")
        plan_id = int(plan_id)
        del self.core.plans[plan_id]
        if record.load:
            self.core.loads.settle(plan_id, completion.ok)  # the records first: their targets wait for them
        self.core.objects.step(record.fills, Event.COPY_DONE if completion.ok else Event.COPY_FAIL)
        req = self.core.requests.by_rid.get(record.request_id)
        if req is not None:
            req.plans.discard(plan_id)
            if not completion.ok and not record.load:  # a failed load's rows lie in the allocation: recomputed
                req.failed_plan = plan_id

    @_locked
    def plan_store(self, rid: int, rows: Sequence[RecordRows]) -> Plan:
        """A plan copying `rows` (row runs of pages request `rid` may read) into tier records' host bytes; run it
        with `executor.run(plan, records={name: buffer})`.  It moves no object (record_plans.py)."""
        req = self._request(rid, "plan_store")
        return record_plans.issue_store(self.core, req, rows)

    @_locked
    def plan_load(self, rid: int, rows: Sequence[RecordRows]) -> Plan:
        """A plan copying tier records' host bytes into `rows` (row runs of pages request `rid` reserved and has
        not committed); its targets are FILLING until `complete(plan.plan_id, completion)`, and a failed load
        leaves them RESERVED for the engine to compute (record_plans.py).  InvalidArgument, nothing changed, for
        a page it may not write; InvalidRequestState during a speculative step."""
        req = self._request(rid, "plan_load")
        self._no_draft(req, "plan_load")
        return record_plans.issue_load(self.core, req, rows)

    @_locked
    def take_events(self) -> list[KVEvent]:
        """The KV cache events since the last call, oldest first (hkv_core.events; docs/events.md).

        ConfigError when the manager was built without `ManagerConfig(kv_events=True)`.
        """
        log = self.core.index.log
        if log is None:
            raise ConfigError("KV cache events are off; build the manager with ManagerConfig(kv_events=True)",
                              source="ManagerConfig", key="kv_events")
        return log.take()

    @_locked
    def clear_cache(self) -> int:
        """Evict every block and resume point (one AllBlocksCleared event); returns the units evicted.

        CacheBusy, nothing changed, while any request is in flight
        (its lease pins what it reads: the index could not be emptied).
        """
        live = len(self.core.requests)
        if live:
            raise CacheBusy(action="clear_cache", live_requests=live)
        log, self.core.index.log = self.core.index.log, None  # its removals are one AllBlocksCleared, not records
        try:
            units = evict.evict_all(self.core, None)
        finally:
            self.core.index.log = log
        if log is not None:
            log.cleared()
        return units

    # ------------------------------------------------------------------ inspection (copies; for tests and tools)

    @_locked
    def pages(self, pool: str, which: ArrayLike | None = None) -> views.PageView:
        """States, versions, leases, index references and owners of pages of `pool` (all when None).

        UnknownPool for a pool the manager does not manage; InvalidArgument when `which` is not a sequence of
        integer page ids of the pool (NULL page 0 included)."""
        return views.pages(self.core, pool, which)

    @_locked
    def free_pages(self, pool: str) -> int:
        """Pages of `pool` free now (UnknownPool for a pool the layout does not have)."""
        return views.free_pages(self.core, pool)

    @_locked
    def pinned(self, rid: int) -> dict[str, dict[int, int]]:
        """Per pool: pages the request's lease lists, with the version each had when pinned."""
        return views.pinned(self.core, self._request(rid, "pinned"))

    @_locked
    def owned(self, rid: int) -> dict[str, list[int]]:
        """Per pool: pages whose objects the request owns (not yet published)."""
        return views.owned(self.core, self._request(rid, "owned"))

    @_locked
    def tables(self, rid: int) -> dict[str, list[int]]:
        """Per pool: the request's page table."""
        return views.tables(self.core, self._request(rid, "tables"))

    @_locked
    def block_keys(self, rid: int, first: int = 0, count: int | None = None) -> NDArray[np.uint64]:
        """A copy of the request's block keys from block `first` on (`count` of them at most; None: all):
        (blocks, 2) uint64, one per complete block of its verified tokens (what a tier names the block's
        records by; docs/tiers.md)."""
        start = max(0, int(first))
        stop = None if count is None else start + max(0, int(count))
        return self._request(rid, "block_keys").keys[start:stop].copy()

    @_locked
    def skip_junction(self, rid: int) -> None:
        """Keep no resume point at the request's junction (ManagerConfig.retain_junction): for an engine that
        will load the request's prefix past it from a tier instead of computing through it (a load can bring
        only the points its tier holds).  Call before allocating; the next uncapped match sets it again."""
        self._request(rid, "skip_junction").junction_tokens = 0

    @_locked
    def retained_boundaries(self, rid: int, start: int, end: int) -> list[int]:
        """The block boundaries b, start < b <= end, where the request keeps a resume point when it computes
        (or loads) through them: the points whose snapshots an allocation over them asks for.

        `start` and `end` are integers with 0 <= start <= end <= the request's known tokens (so the answer is
        bounded by the request); anything else raises InvalidRequestArgument naming the argument."""
        req = self._request(rid, "retained_boundaries")
        known = len(req.tokens)
        for argument, value, low in (("start", start, 0), ("end", end, None)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise InvalidRequestArgument(request_id=rid, action="retained_boundaries", argument=argument,
                                             value=value, reason=f"must be an integer, got {type(value).__name__}")
            lo = int(start) if low is None else low
            if not lo <= int(value) <= known:
                raise InvalidRequestArgument(request_id=rid, action="retained_boundaries", argument=argument,
                                             value=value, reason=f"must lie in [{lo}, {known}] (the request knows "
                                                                 f"{known} tokens; start <= end)")
        return retention.retained_between(self.core, req, int(start), int(end))

    @_locked
    def chain(self, rid: int) -> list[int]:
        """Block ids of the request's chain in the index."""
        return self._request(rid, "chain").chain.tolist()

    @_locked
    def index_counts(self) -> dict[str, int]:
        """Blocks, resume points and keys in the index."""
        return views.index_counts(self.core)

    @_locked
    def snapshot(self) -> tuple[object, ...]:
        """A hashable fingerprint of the whole state (equal before and after a call that changed nothing)."""
        return views.snapshot(self.core)

    # ------------------------------------------------------------------ helpers

    def _request(self, rid: int, action: str) -> RequestState:
        if isinstance(rid, bool) or not isinstance(rid, int | np.integer):
            raise InvalidArgument(action=action, argument="rid", value=rid,
                                  reason=f"a request id is the int add_request returned, got {type(rid).__name__}")
        req = self.core.requests.by_rid.get(rid)
        if req is None:
            raise UnknownRequest(request_id=rid, action=action)
        return req

    def _count(self, req: RequestState, action: str, value: object, room: int) -> int:
        """`value` (argument `num_tokens`) as a token count in [1, room], else InvalidRequestArgument naming the
        argument, the value and the range (nothing changes).  Scalar checks only: the hot path stays O(1)."""
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise InvalidRequestArgument(request_id=req.rid, action=action, argument="num_tokens", value=value,
                                         reason=f"must be an integer, got {type(value).__name__}")
        count = int(value)
        if not 1 <= count <= room:
            now = (f"{req.allocated} tokens allocated, {req.computed} committed, {len(req.tokens)} known"
                   if action == "commit" else f"{len(req.tokens)} tokens known, {req.allocated} allocated")
            if action == "allocate_ahead":
                now += f", max_request_tokens {self.core.config.max_request_tokens}"
            verb = "commit" if action == "commit" else "allocate"
            bound = f"must lie in [1, {room}]" if room >= 1 else f"must be at least 1, and none is left to {verb}"
            raise InvalidRequestArgument(request_id=req.rid, action=action, argument="num_tokens", value=value,
                                         reason=f"{bound} ({now})")
        return count

    @staticmethod
    def _acquired_why(req: RequestState) -> str:
        """Why a request can take no (new) hit: it acquired one, or allocate already started it."""
        if req.allocated > req.hit_tokens:
            return (f"already acquired: allocate started the request at token {req.hit_tokens} "
                    f"({req.allocated} tokens allocated); match and acquire come before the first allocate")
        return "already acquired"

    def _no_draft(self, req: RequestState, action: str) -> None:
        if req.draft is not None:
            raise InvalidRequestState(request_id=req.rid, action=action,
                                      reason="a speculative step is in flight: accept or reject it first")

    def _draft(self, req: RequestState, action: str) -> DraftState:
        if req.draft is None:
            raise InvalidRequestState(request_id=req.rid, action=action, reason="no speculative step in flight")
        return req.draft

    def _no_plans(self, req: RequestState, action: str) -> None:
        if req.plans:
            raise InvalidRequestState(request_id=req.rid, action=action,
                                      reason=f"copy plans {sorted(req.plans)} are still in flight: complete them first")
        if req.failed_plan >= 0 and action in ("commit", "propose", "accept"):
            step = req.draft is not None and req.draft.plan == req.failed_plan
            raise InvalidRequestState(request_id=req.rid, action=action,
                                      reason=f"copy plan {req.failed_plan} failed: " + (
                                          "reject the step" if step else "release the request and retry"))

    def _assert_invariants(self, action: str) -> None:
        broken = check_invariants(self)
        if broken:
            raise InvariantViolation(action=action, violations=broken)
