"""Implementation-level model check: drive the real CacheManager through every API sequence.

Breadth-first over sequences of API calls (add a request for one of a few
prompts sharing a prefix, match + acquire, acquire a hit that went stale,
allocate a chunk, commit, release, evict) up to `max_depth` calls, on the tiny
layout with small pools.  States are deduplicated by a canonical snapshot of
the manager.  In every state every spec invariant is evaluated on the live
structures (`check_invariants`); a call that raises an HkvError must leave the
snapshot unchanged.  Violations come with the shortest call trace.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Iterator

import attrs
import numpy as np

from hkv_core.block_keys import ExtraKeys
from hkv_core.errors import HkvError
from hkv_core.layout import Layout
from hkv_core.manager import admit, alloc, commit, evict, hit, lease, release
from hkv_core.manager.config import ManagerConfig
from hkv_core.manager.core import Core, RequestState, clone_core
from hkv_core.manager.invariants import check_invariants
from hkv_core.manager.manager import CacheManager

Action = Callable[[Core], None]
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


def snapshot(core: Core) -> tuple[object, ...]:
    """A canonical, hashable view of everything the invariants and later calls depend on."""
    pools = tuple((p.state.tobytes(), p.version.tobytes(), p.leases.tobytes(), p.holders.tobytes(),
                   p.owner.tobytes(), tuple(sorted(p.free))) for p in core.pools)
    a = core.arena
    alive = np.flatnonzero(a.alive)
    arena = (alive.tobytes(), a.key[alive].tobytes(), a.parent[alive].tobytes(), a.point[alive].tobytes(),
             a.prefix_pages[alive].tobytes(), a.window_pages[alive].tobytes(), a.tail_pages[alive].tobytes())
    reqs = tuple((r.rid, len(r.tokens), r.computed, r.allocated, r.acquired, tuple(r.chain),
                  tuple(tuple(t) for t in r.tables), tuple(tuple(sorted(o)) for o in r.owned),
                  tuple(tuple(sorted(p.items())) for p in r.pinned_versions), tuple(sorted(r.snapshots)))
                 for r in core.requests.values())
    return pools, arena, reqs


def actions(config: ImplCheckConfig, core: Core) -> Iterator[tuple[str, Action]]:
    for i, tokens in enumerate(prompts(core.block_tokens)):
        if len(core.requests) < config.max_requests:
            yield f"add(prompt{i})", functools.partial(_add, tokens=tokens)
    for rid, req in list(core.requests.items()):
        yield from _request_actions(config, rid, req)
    yield "evict(1)", lambda c: _evict(c, 1)
    yield "evict(all)", lambda c: _evict(c, None)


def _request_actions(config: ImplCheckConfig, rid: int, req: RequestState) -> Iterator[tuple[str, Action]]:
    if not req.acquired:
        yield f"match+acquire(r{rid})", lambda c: lease.acquire(c, c.requests[rid], hit.match(c, c.requests[rid]))
        yield f"match,evict,acquire(r{rid})", lambda c: _stale_acquire(c, rid)
    for chunk in config.chunk_tokens:
        if req.allocated + chunk <= len(req.tokens):
            yield f"allocate(r{rid}, {chunk})", functools.partial(_allocate, rid=rid, n=chunk)
    if req.allocated > req.computed:
        yield f"commit(r{rid})", lambda c: commit.commit(c, c.requests[rid], c.requests[rid].allocated
                                                         - c.requests[rid].computed)
    yield f"release(r{rid})", lambda c: release.release(c, c.requests[rid])


def _add(core: Core, tokens: np.ndarray) -> None:
    admit.add_request(core, tokens, ExtraKeys())


def _allocate(core: Core, rid: int, n: int) -> None:
    alloc.allocate(core, core.requests[rid], n)


class ChangedOnFailure(Exception):
    """A call raised an HkvError but changed the manager (the checker reports it)."""


def _stale_acquire(core: Core, rid: int) -> None:
    """Match, let eviction run, then acquire: StaleLease must leave everything as it was."""
    found = hit.match(core, core.requests[rid])
    evict.evict_all(core)
    before = snapshot(core)
    try:
        lease.acquire(core, core.requests[rid], found)
    except HkvError:
        if snapshot(core) != before:
            raise ChangedOnFailure from None


def _evict(core: Core, units: int | None) -> None:
    evict.evict_all(core, units)


def check_implementation(config: ImplCheckConfig | None = None,
                         progress: Callable[[int], None] | None = None) -> ImplCheckResult:
    """Explore every API call sequence up to the bound; check every invariant in every state."""
    config = config or ImplCheckConfig()
    started = time.perf_counter()
    manager = CacheManager(Layout.from_preset(config.layout),
                           ManagerConfig(default_pool_pages=config.pool_pages, max_requests=config.max_requests,
                                         retain_every_blocks=config.retain_every_blocks, seed=7))
    start = manager.core
    seen = {snapshot(start)}
    queue: deque[tuple[Core, tuple[str, ...]]] = deque([(start, ())])
    calls = failed = checked = 0
    violations: dict[str, tuple[str, ...]] = {}
    while queue:
        core, trace = queue.popleft()
        for message in check_invariants(core):
            violations.setdefault(message.split(":")[0], trace + (message,))
        checked += 1
        if len(trace) >= config.max_depth:
            continue
        for label, action in list(actions(config, core)):
            calls += 1
            twin, before = clone_core(core), snapshot(core)
            try:
                action(twin)
            except ChangedOnFailure:
                violations.setdefault("failed_call_changed_state", trace + (label,))
                continue
            except HkvError:
                failed += 1
                if snapshot(twin) != before:
                    violations.setdefault("failed_call_changed_state", trace + (label,))
                continue
            key = snapshot(twin)
            if key not in seen:
                seen.add(key)
                queue.append((twin, trace + (label,)))
                if progress is not None and len(seen) % PROGRESS_EVERY_STATES == 0:
                    progress(len(seen))
    return ImplCheckResult(states_explored=len(seen), calls_explored=calls,
                           invariants_checked=checked * len(start.spec.invariants), failed_calls=failed,
                           violations=tuple(violations.items()), seconds=time.perf_counter() - started)
