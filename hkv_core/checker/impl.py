"""Implementation-level model check: drive the real CacheManager through every API sequence.

Breadth-first over sequences of public API calls (add a request for one of a
few prompts sharing a prefix, match + acquire, acquire a hit that went stale,
allocate a chunk or the rest of the prompt, allocate `ahead_tokens` positions
ahead of the known tokens, append the tokens that make them known (commit
past the known tokens is tried and must be refused), complete its copy plan
(or report it failed), load tier records into the pages a request reserved (a
plan settled by `complete`, or reported failed: the pages are then RESERVED for
the request to compute), commit, propose a speculative step then accept some of
its drafts or reject it, release, evict, restart - a new manager, empty, with
whatever was in flight gone) up to `max_depth` calls, on a tiny layout
with small pools, starting from a manager whose index already holds the
`seeded` prompts (computed and released), so that paths that need a populated
index - a request re-recording a kept point and losing it to eviction (window
pages retire, then are reclaimed) - lie within a few calls.  Each call runs on a
clone of the manager; states are deduplicated by the manager's snapshot.  In
every state every spec invariant is evaluated on the live structures
(`check_invariants`); a call that raises an HkvError must leave the snapshot
unchanged, and a call that raises anything else is reported (`call_crashed`).
Violations come with the shortest call trace.  At `max_states`
states the search stops growing (every state found is still checked) and the
result says `truncated`.  Given a lifecycle spec, the manager runs on it (its
compiled tables, its invariants); by default on the shipped one.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Iterator

import attrs
import numpy as np

from hkv_core.checker.world import within
from hkv_core.errors import HkvError
from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig, check_invariants
from hkv_core.manager.core import Core
from hkv_core.manager.roles import events_fired
from hkv_core.plan import Completion, RecordRows
from hkv_core.spec.records import LifecycleSpec

Action = Callable[[CacheManager], None]
PROGRESS_EVERY_STATES = 500
# The largest bound `hkv check` accepts (docs/cli.md says why).  Every state holds a manager clone (about
# 30 KB on tiny_csa) and costs about 2 ms to expand: 50,000 states took 82 s and 1.5 GB.  The default depth,
# 6, reaches about 18,000 states; MAX_DEPTH only rejects nonsense, the state cap bounds the work.
MAX_DEPTH = 12
MAX_STATES = 50_000


@attrs.frozen(kw_only=True)
class ImplCheckConfig:
    layout: str = "tiny_csa"
    block_tokens: int | None = 4  # None: the preset's; 4 packs two indexer entries a page (partial pages seal)
    pool_pages: int = 6
    max_requests: int = 2
    max_depth: int = 6
    retain_every_blocks: int = 1
    chunk_tokens: tuple[int, ...] = (4, 8)
    draft_tokens: tuple[int, ...] = (3,)  # draft lengths of the speculative steps proposed
    ahead_tokens: int = 4  # positions an allocate_ahead reserves (0: none), from within 4 tokens of the known end
    seeded: tuple[int, ...] = (0,)  # prompts computed and released before the search starts
    shared_pages: int | None = None  # one block space every pool draws from (ManagerConfig.shared_pages)
    stop_on_violation: bool = False  # end the search at the first violation (broken-variant tests)
    max_states: int = MAX_STATES  # at the cap the search stops growing and the result says truncated

    def __attrs_post_init__(self) -> None:
        within("ImplCheckConfig", "max_depth", self.max_depth, 0, MAX_DEPTH)
        within("ImplCheckConfig", "max_states", self.max_states, 1, MAX_STATES)


@attrs.frozen(kw_only=True)
class ImplCheckResult:
    states_explored: int
    calls_explored: int
    invariants_checked: int
    failed_calls: int
    violations: tuple[tuple[str, tuple[str, ...]], ...]
    seconds: float
    transitions_taken: tuple[str, ...] = ()  # "kind.event" steps some explored call took
    transitions_missed: tuple[str, ...] = ()  # steps the manager can take on this layout that none did
    truncated: bool = False  # the state cap (config.max_states) stopped the search


def fired_transitions(m: CacheManager) -> set[tuple[str, str]]:
    """(kind, event) of every step the manager can take on its layout: page pools' events and the index's."""
    lanes = tuple(pool.spec for pool in m.core.pools)
    pages = {(lane.kind, e.value) for lane in lanes for e in events_fired(lanes)[lane.index]}
    index = {(table.table.kind, e.value) for table in (m.core.index.blocks, m.core.index.points) for e in table.FIRES}
    loads = {(m.core.loads.table.kind, e.value) for e in m.core.loads.FIRES}
    return pages | index | loads


def prompts(block_tokens: int) -> tuple[np.ndarray, ...]:
    """Three prompts: two share two blocks, one shares nothing; the odd lengths end inside a page after a
    completed compressed entry (so releasing their writers seals a partial page)."""
    base = np.arange(1, 2 * block_tokens + 1) % 60
    return (np.concatenate([base, [5, 6, 7, 8, 9]]), np.concatenate([base, base[:block_tokens] + 1]),
            (np.arange(block_tokens + 5) * 7 + 3) % 60)


def state_key(m: CacheManager) -> tuple[object, ...]:
    """The snapshot without counters (ids issued, eviction statistics): what later calls depend on."""
    return m.snapshot()[:4]


def actions(config: ImplCheckConfig, m: CacheManager) -> Iterator[tuple[str, Action]]:
    core = m.core
    for i, tokens in enumerate(prompts(core.block_tokens)):
        if len(core.requests) < config.max_requests:
            yield f"add(prompt{i})", functools.partial(_add, tokens=tokens)
    for req in core.requests.live():
        if req.draft is not None:
            yield from _step_actions(req.rid, len(req.draft.tokens))
            continue
        yield from _request_actions(config, req.rid, req.acquired, req.allocated, req.computed, len(req.tokens))
        if req.allocated > req.computed and not req.plans:
            yield f"tier_load(r{req.rid})", functools.partial(_tier_load, rid=req.rid)
        if req.acquired and req.allocated == req.computed:
            for k in config.draft_tokens:
                yield f"propose(r{req.rid}, {k})", functools.partial(_propose, rid=req.rid, k=k)
    for plan_id in sorted(core.plans):
        yield f"complete(plan{plan_id})", functools.partial(_complete, plan_id=plan_id, ok=True)
        yield f"complete(plan{plan_id}, failed)", functools.partial(_complete, plan_id=plan_id, ok=False)
    yield "evict(1)", lambda m: _evict(m, 1)
    yield "evict(all)", lambda m: _evict(m, None)
    if core.requests.live() or core.index.blocks.live:
        yield "restart", _restart


def _request_actions(config: ImplCheckConfig, rid: int, acquired: bool, allocated: int, computed: int,
                     known: int) -> Iterator[tuple[str, Action]]:
    if not acquired:
        yield f"match+acquire(r{rid})", lambda m: m.acquire(rid, m.match(rid))
        yield f"match,evict,acquire(r{rid})", lambda m: _stale_acquire(m, rid)
    for chunk in config.chunk_tokens:
        if allocated + chunk <= known:
            yield f"allocate(r{rid}, {chunk})", functools.partial(_allocate, rid=rid, n=chunk)
    if 0 < known - allocated < max(config.chunk_tokens) and known - allocated not in config.chunk_tokens:
        yield f"allocate(r{rid}, {known - allocated})", functools.partial(_allocate, rid=rid, n=known - allocated)
    yield from _ahead_actions(config, rid, acquired, allocated, known)
    if min(allocated, known) > computed:
        yield f"commit(r{rid})", lambda m: m.commit(rid, min(allocated, known) - computed)
    if allocated > known:  # refused: slots reserved ahead are not known yet
        yield f"commit(r{rid}, past known)", lambda m: m.commit(rid, allocated - computed)
    yield f"release(r{rid})", lambda m: m.release(rid)


def _ahead_actions(config: ImplCheckConfig, rid: int, acquired: bool, allocated: int,
                   known: int) -> Iterator[tuple[str, Action]]:
    """Slots reserved ahead of the known tokens (from the known end, or a little before it), and the
    append_tokens that makes every allocated position known."""
    n = config.ahead_tokens
    if n and acquired and known - n < allocated <= known:
        yield f"allocate_ahead(r{rid}, {n})", functools.partial(_allocate_ahead, rid=rid, n=n)
    if allocated > known:
        yield f"append(r{rid}, {allocated - known})", functools.partial(_append, rid=rid, n=allocated - known)


def _allocate_ahead(m: CacheManager, rid: int, n: int) -> None:
    m.allocate_ahead(rid, n)


def _append(m: CacheManager, rid: int, n: int) -> None:
    _, _, known = m.request_tokens(rid)
    m.append_tokens(rid, (np.arange(known, known + n) * 3 + 2) % 60)


def _step_actions(rid: int, k: int) -> Iterator[tuple[str, Action]]:
    """A speculative step in flight: accept none, one or all of its drafts, or reject it."""
    for n in sorted({0, 1, k}):
        yield f"accept(r{rid}, {n})", functools.partial(_accept, rid=rid, n=n)
    yield f"reject(r{rid})", lambda m: m.reject(rid)
    yield f"release(r{rid})", lambda m: m.release(rid)


def _propose(m: CacheManager, rid: int, k: int) -> None:
    _, _, known = m.request_tokens(rid)
    m.propose(rid, (np.arange(known, known + k) * 5 + 1) % 60)


def _accept(m: CacheManager, rid: int, n: int) -> None:
    m.accept(rid, n)


def _add(m: CacheManager, tokens: np.ndarray) -> None:
    m.add_request(tokens)


def _allocate(m: CacheManager, rid: int, n: int) -> None:
    m.allocate(rid, n)


def _tier_load(m: CacheManager, rid: int) -> None:
    """A tier load into every page the request reserved and has not committed (plan_load: FILLING until its
    plan completes - the `complete` calls then settle it, or report it failed)."""
    core = m.core
    o, req = core.objects, core.requests.by_rid[rid]
    rows = []
    for pool in core.pools:
        objs = pool.slot_object[1:]
        pages = np.flatnonzero((objs != 0) & (o.owner[objs] == req.slot) & o.reserved[o.code[objs]]
                               & (req.computed < o.full_token[objs])) + 1
        per_page = pool.spec.entries_per_page
        rows += [RecordRows(pool=pool.spec.members[0].name, runs=[(int(p), 0, per_page)], record=f"r{int(p)}")
                 for p in pages]
    m.plan_load(rid, rows)


def _restart(m: CacheManager) -> None:
    """The process ends - requests, plans and tier loads in flight end with it - and a new manager starts on
    the same layout, config and spec with empty pools (the tiers keep their records: its requests load them
    into the pages they reserve, by `tier_load`, like any other)."""
    old = m.core
    key = (id(old.layout), id(old.config), id(old.spec))  # shared by every clone of one search
    fresh = _FRESH.get(key)
    if fresh is None:
        fresh = _FRESH[key] = Core(old.layout, old.config, old.spec)  # built once, then cloned (cheaper)
    m.core = fresh.clone()
    m.core.objects.seen = old.objects.seen


_FRESH: dict[tuple[int, int, int], Core] = {}


def _complete(m: CacheManager, plan_id: int, ok: bool) -> None:
    m.complete(plan_id, Completion() if ok else Completion(ok=False, error="checker: copy failed"))


class ChangedOnFailure(Exception):
    """A call raised an HkvError but changed the manager (the checker reports it)."""


def _stale_acquire(m: CacheManager, rid: int) -> None:
    """Match, let eviction run, then acquire: a refused acquire must leave everything as it was."""
    found = m.match(rid)
    m.evict()
    before = m.snapshot()
    try:
        m.acquire(rid, found)
    except HkvError:
        if m.snapshot() != before:
            raise ChangedOnFailure from None


def _evict(m: CacheManager, units: int | None) -> None:
    m.evict(units)


def seeded_manager(config: ImplCheckConfig, spec: LifecycleSpec | None = None) -> CacheManager:
    """The search's start: a manager whose index holds the seeded prompts (each computed whole, then released).

    With `spec`, the manager runs on that lifecycle spec instead of the shipped one (SpecError when the spec
    lacks an event the manager fires on this layout).
    """
    layout = Layout.from_preset(config.layout, block_tokens=config.block_tokens)
    limits = ManagerConfig(default_pool_pages=config.pool_pages, max_requests=config.max_requests,
                           retain_every_blocks=config.retain_every_blocks, key_seed=7,
                           shared_pages=config.shared_pages)
    m = CacheManager(layout, limits)
    if spec is not None:
        m.core = Core(layout, limits, spec)
    every = prompts(m.core.block_tokens)
    for i in config.seeded:
        rid = m.add_request(every[i])
        m.acquire(rid, m.match(rid))
        allocation = m.allocate(rid, len(every[i]) - m.request_tokens(rid)[0])
        if allocation.plan is not None:
            m.complete(allocation.plan.plan_id, Completion())
        m.commit(rid, allocation.num_tokens)
        m.release(rid)
    return m


def check_implementation(config: ImplCheckConfig | None = None,
                         progress: Callable[[int], None] | None = None,
                         spec: LifecycleSpec | None = None) -> ImplCheckResult:
    """Explore every API call sequence up to the bound; check every invariant in every state.

    `spec`: the lifecycle spec the manager runs on (default: the shipped one).
    """
    config = config or ImplCheckConfig()
    started = time.perf_counter()
    start = seeded_manager(config, spec)
    taken: set[tuple[str, str]] = set()  # shared by every clone: the steps any explored call took
    start.core.objects.seen = taken
    seen = {state_key(start)}
    seeding = tuple(f"seed(prompt{i}: add, match+acquire, allocate, commit, release)" for i in config.seeded)
    queue: deque[tuple[CacheManager, tuple[str, ...]]] = deque([(start, seeding)])
    calls = failed = checked = 0
    truncated = False
    violations: dict[str, tuple[str, ...]] = {}
    while queue and not (violations and config.stop_on_violation):
        m, trace = queue.popleft()
        for message in check_invariants(m):
            violations.setdefault(message.split(":")[0], trace + (message,))
        checked += 1
        if truncated or len(trace) - len(seeding) >= config.max_depth or (violations and config.stop_on_violation):
            continue  # once truncated, the states already found are checked, not expanded
        before = m.snapshot()  # what every failing call from this state must leave unchanged
        for label, action in list(actions(config, m)):
            calls += 1
            twin = m.clone()
            try:
                action(twin)
            except ChangedOnFailure:
                violations.setdefault("failed_call_changed_state", trace + (label,))
                continue
            except HkvError:
                failed += 1
                if twin.snapshot() != before:
                    violations.setdefault("failed_call_changed_state", trace + (label,))
                continue
            except Exception as exc:  # a (broken) manager's state no call can handle: reported, not fatal
                violations.setdefault("call_crashed", trace + (label, f"{type(exc).__name__}: {exc}"))
                continue
            key = state_key(twin)
            if key not in seen:
                if len(seen) >= config.max_states:
                    truncated = True
                    break
                seen.add(key)
                queue.append((twin, trace + (label,)))
                if progress is not None and len(seen) % PROGRESS_EVERY_STATES == 0:
                    progress(len(seen))
    possible = fired_transitions(start)
    return ImplCheckResult(states_explored=len(seen), calls_explored=calls,
                           invariants_checked=checked * len(start.core.spec.invariants), failed_calls=failed,
                           violations=tuple(violations.items()), seconds=time.perf_counter() - started,
                           transitions_taken=tuple(sorted(f"{k}.{e}" for k, e in taken)),
                           transitions_missed=tuple(sorted(f"{k}.{e}" for k, e in possible - taken)),
                           truncated=truncated)
