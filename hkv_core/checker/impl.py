"""Implementation-level model check: drive the real CacheManager through every API sequence.

Breadth-first over sequences of public API calls (add a request for one of a
few prompts sharing a prefix, match + acquire, acquire a hit that went stale,
allocate a chunk, complete its copy plan, commit, release, evict) up to
`max_depth` calls, on a tiny layout with small pools.  Each call runs on a
clone of the manager; states are deduplicated by the manager's snapshot.  In
every state every spec invariant is evaluated on the live structures
(`check_invariants`); a call that raises an HkvError must leave the snapshot
unchanged.  Violations come with the shortest call trace.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Iterator

import attrs
import numpy as np

from hkv_core.errors import HkvError
from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig, check_invariants
from hkv_core.plan import Completion

Action = Callable[[CacheManager], None]
PROGRESS_EVERY_STATES = 500


@attrs.frozen(kw_only=True)
class ImplCheckConfig:
    layout: str = "tiny_csa"
    pool_pages: int = 6
    max_requests: int = 2
    max_depth: int = 7
    retain_every_blocks: int = 1
    chunk_tokens: tuple[int, ...] = (8, 16)


@attrs.frozen(kw_only=True)
class ImplCheckResult:
    states_explored: int
    calls_explored: int
    invariants_checked: int
    failed_calls: int
    violations: tuple[tuple[str, tuple[str, ...]], ...]
    seconds: float


def prompts(block_tokens: int) -> tuple[np.ndarray, ...]:
    """Three prompts: two share two blocks, one shares nothing."""
    base = np.arange(1, 2 * block_tokens + 1) % 60
    return (np.concatenate([base, [5, 6, 7]]), np.concatenate([base, base[:block_tokens] + 1]),
            (np.arange(block_tokens + 3) * 7 + 3) % 60)


def state_key(m: CacheManager) -> tuple[object, ...]:
    """The snapshot without counters (ids issued, eviction statistics): what later calls depend on."""
    return m.snapshot()[:4]


def actions(config: ImplCheckConfig, m: CacheManager) -> Iterator[tuple[str, Action]]:
    core = m.core
    for i, tokens in enumerate(prompts(core.block_tokens)):
        if len(core.requests) < config.max_requests:
            yield f"add(prompt{i})", functools.partial(_add, tokens=tokens)
    for req in core.requests.live():
        yield from _request_actions(config, req.rid, req.acquired, req.allocated, req.computed, len(req.tokens))
    for plan_id in sorted(core.plans):
        yield f"complete(plan{plan_id})", functools.partial(_complete, plan_id=plan_id)
    yield "evict(1)", lambda m: _evict(m, 1)
    yield "evict(all)", lambda m: _evict(m, None)


def _request_actions(config: ImplCheckConfig, rid: int, acquired: bool, allocated: int, computed: int,
                     known: int) -> Iterator[tuple[str, Action]]:
    if not acquired:
        yield f"match+acquire(r{rid})", lambda m: m.acquire(rid, m.match(rid))
        yield f"match,evict,acquire(r{rid})", lambda m: _stale_acquire(m, rid)
    for chunk in config.chunk_tokens:
        if allocated + chunk <= known:
            yield f"allocate(r{rid}, {chunk})", functools.partial(_allocate, rid=rid, n=chunk)
    if allocated > computed:
        yield f"commit(r{rid})", lambda m: m.commit(rid, allocated - computed)
    yield f"release(r{rid})", lambda m: m.release(rid)


def _add(m: CacheManager, tokens: np.ndarray) -> None:
    m.add_request(tokens)


def _allocate(m: CacheManager, rid: int, n: int) -> None:
    m.allocate(rid, n)


def _complete(m: CacheManager, plan_id: int) -> None:
    m.complete(plan_id, Completion())


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


def check_implementation(config: ImplCheckConfig | None = None,
                         progress: Callable[[int], None] | None = None) -> ImplCheckResult:
    """Explore every API call sequence up to the bound; check every invariant in every state."""
    config = config or ImplCheckConfig()
    started = time.perf_counter()
    start = CacheManager(Layout.from_preset(config.layout),
                         ManagerConfig(default_pool_pages=config.pool_pages, max_requests=config.max_requests,
                                       retain_every_blocks=config.retain_every_blocks, seed=7))
    seen = {state_key(start)}
    queue: deque[tuple[CacheManager, tuple[str, ...]]] = deque([(start, ())])
    calls = failed = checked = 0
    violations: dict[str, tuple[str, ...]] = {}
    while queue:
        m, trace = queue.popleft()
        for message in check_invariants(m):
            violations.setdefault(message.split(":")[0], trace + (message,))
        checked += 1
        if len(trace) >= config.max_depth:
            continue
        for label, action in list(actions(config, m)):
            calls += 1
            twin, before = m.clone(), m.snapshot()
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
            key = state_key(twin)
            if key not in seen:
                seen.add(key)
                queue.append((twin, trace + (label,)))
                if progress is not None and len(seen) % PROGRESS_EVERY_STATES == 0:
                    progress(len(seen))
    return ImplCheckResult(states_explored=len(seen), calls_explored=calls,
                           invariants_checked=checked * len(start.core.spec.invariants), failed_calls=failed,
                           violations=tuple(violations.items()), seconds=time.perf_counter() - started)
