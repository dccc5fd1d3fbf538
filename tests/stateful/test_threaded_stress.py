"""Several threads share one CacheManager; one more thread evicts all the time.

Each worker runs a bounded, seeded loop of whole requests over shared
prefixes (add_request, match, acquire, allocate / commit in random chunks, a
little decode, a few speculative steps - propose, the checkpoint copy, accept
some drafts or reject - release) and handles the typed errors the API documents:
StaleLease (counted, and checked against the hit it refused), OutOfPages,
AdmissionRejected.  A worker runs its own copy plans: it verifies each (as an
executor does at launch: the sources it pinned cannot have moved), yields to
the other threads, then completes it.  At the end every request is released,
the invariants hold, and no page leaked, is pinned or has an owner.

Each run happens in a forked child process, so that a manager that loops
forever under its lock fails this test after RUN_TIMEOUT_S instead of hanging
the suite.
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

import attrs
import numpy as np
import pytest

from hkv_core.layout import Layout
from hkv_core.manager import (
    AdmissionRejected,
    CacheManager,
    Hit,
    ManagerConfig,
    OutOfPages,
    StaleLease,
    check_invariants,
)
from hkv_core.manager import release as release_module
from hkv_core.manager.core import Core
from hkv_core.manager.requests import RequestState
from hkv_core.plan import Completion

WORKERS = 5
ITERATIONS = 150
SEEDS = (0, 1, 2)
RUN_TIMEOUT_S = 120
SWITCH_INTERVAL_S = 1e-3  # switch threads more often than the default 5 ms, for more interleavings
EVICT_PAUSE_S = 5e-4
VOCAB_TOKENS = 1000
SALTS = (None, "tenant-a")

SETUPS = {
    "tiny_v4": (None, ManagerConfig(default_pool_pages=40, max_requests=4, retain_every_blocks=1, key_seed=0)),
    "deepseek_v4_flash": (16, ManagerConfig(default_pool_pages=112, max_requests=4, retain_every_blocks=4, key_seed=0)),
}


@attrs.define
class Tally:
    """What one worker saw."""

    served: int = 0
    hits: int = 0
    stale: list[tuple[Hit, StaleLease]] = attrs.field(factory=list)
    out_of_pages: int = 0
    rejected: int = 0
    plans: int = 0
    steps: int = 0  # speculative steps settled (accepted or rejected)


def prompts(layout: Layout) -> list[np.ndarray]:
    """Shared heads: one spans the largest prefix page, one shares half of it, one extends it."""
    bt = layout.block_tokens
    unit = max(4 * bt, *[p.tokens_per_page for p in layout.pools if p.object_kind.value != "swa_window"])
    root = np.random.default_rng(7).integers(0, VOCAB_TOKENS, 2 * unit)
    other = np.random.default_rng(8).integers(0, VOCAB_TOKENS, 2 * unit)
    head = root[:unit + 2 * bt]
    return [head, np.concatenate([root[:unit // 2], other[:unit // 2 + bt // 2]]),
            np.concatenate([head, other[:3 * bt]])]


def serve(m: CacheManager, rng: np.random.Generator, heads: list[np.ndarray], tally: Tally) -> None:
    """One request, start to end; the typed errors are expected, anything else fails the test."""
    bt = m.layout.block_tokens
    suffix = rng.integers(0, VOCAB_TOKENS, int(rng.integers(0, 3 * bt)))
    tokens = np.concatenate([heads[int(rng.integers(len(heads)))], suffix])
    try:
        rid = m.add_request(tokens, cache_salt=SALTS[int(rng.integers(len(SALTS)))])
    except AdmissionRejected:
        tally.rejected += 1
        return
    try:
        hit = m.match(rid)
        time.sleep(0)  # let the evictor (or another worker's allocation) run between match and acquire
        try:
            m.acquire(rid, hit)
            tally.hits += hit.tokens > 0
            assert m.request_tokens(rid) == (hit.tokens, hit.tokens, len(tokens))
        except StaleLease as err:
            tally.stale.append((hit, err))
        prefill_and_decode(m, rid, rng, len(tokens), tally)
    finally:
        m.release(rid)
    tally.served += 1


def prefill_and_decode(m: CacheManager, rid: int, rng: np.random.Generator, known: int, tally: Tally) -> None:
    bt = m.layout.block_tokens
    for _ in range(int(rng.integers(0, 3))):
        m.append_tokens(rid, rng.integers(0, VOCAB_TOKENS, 1))
        known += 1
    computed, _, _ = m.request_tokens(rid)
    while computed < known:
        n = min(known - computed, int(rng.choice([1, bt, 4 * bt, known])))
        try:
            alloc = m.allocate(rid, n)
        except OutOfPages:
            tally.out_of_pages += 1
            return
        if alloc.plan is not None:  # the worker is its own executor
            m.verify(alloc.plan)
            time.sleep(0)  # the evictor and the other workers run while the copies are in flight
            m.complete(alloc.plan.plan_id, Completion())
            tally.plans += 1
        m.commit(rid, n)
        computed += n
        assert m.request_tokens(rid) == (computed, computed, known)
    for _ in range(int(rng.integers(0, 3))):
        if not speculate(m, rid, rng, tally):
            return


def speculate(m: CacheManager, rid: int, rng: np.random.Generator, tally: Tally) -> bool:
    """One speculative step after a verified token: propose, run its copy, accept some drafts or reject;
    False when the pools could not hold it (OutOfPages: nothing changed)."""
    m.append_tokens(rid, rng.integers(0, VOCAB_TOKENS, 1))
    computed, _, known = m.request_tokens(rid)
    k = int(rng.integers(1, 9))
    try:
        alloc = m.propose(rid, rng.integers(0, VOCAB_TOKENS, k))
    except OutOfPages:
        tally.out_of_pages += 1
        return False
    if alloc.plan is not None:
        m.verify(alloc.plan)
        time.sleep(0)  # other threads run while the checkpoint copy is in flight
        m.complete(alloc.plan.plan_id, Completion())
    time.sleep(0)  # and while the step's forward pass runs
    n = int(rng.integers(-1, k + 1))
    if n < 0:
        m.reject(rid)
        assert m.request_tokens(rid) == (computed, computed, known)
        try:
            m.allocate(rid, known - computed)  # the verified token is computed without speculation after all
        except OutOfPages:
            tally.out_of_pages += 1
            return False
        m.commit(rid, known - computed)
    else:
        m.accept(rid, n)
        m.commit(rid, known - computed + n)
        assert m.request_tokens(rid) == (known + n,) * 3
    tally.steps += 1
    return True


def stale_problem(hit: Hit, err: StaleLease) -> str | None:
    """What is wrong with `err` as the refusal of `hit`: it must name a block, the resume point or a page of
    the hit, the version the hit recorded for it, and a version or state that moved (None: nothing wrong)."""
    if err.request_id != hit.request_id:
        return f"{err}: not about request {hit.request_id}"
    if err.pool == "block":
        where = np.flatnonzero(hit.block_ids == err.page)
        recorded, state = (int(hit.block_versions[where[0]]) if where.size else None), "INDEXED"
    elif err.pool == "resume_point":
        recorded, state = (hit.point_version if err.page == hit.point != -1 else None), "KEPT"
    else:
        where = np.flatnonzero(hit.pages.get(err.pool, np.zeros(0, np.int32)) == err.page)
        recorded, state = (int(hit.versions[err.pool][where[0]]) if where.size else None), "PUBLISHED"
    if recorded is None:
        return f"{err}: not a {err.pool} entry of request {hit.request_id}'s hit"
    if err.expected_version != recorded or err.expected_state != state:
        return f"{err}: the hit recorded version {recorded} and needs {state}"
    if err.found_version == err.expected_version and err.found_state == err.expected_state:
        return f"{err}: neither the version nor the state moved"
    return None


def stale_problems(tallies: list[Tally]) -> list[str]:
    return [p for t in tallies for hit, err in t.stale if (p := stale_problem(hit, err)) is not None]


def leaks(m: CacheManager) -> list[str]:
    """Pages in use that the index does not hold, pins, copy pins or owners left (every request released)."""
    out = []
    for binding in m.bindings():
        name, view = binding.name, m.pages(binding.name)
        used = np.array([s != "FREE" for s in view.states])
        used[0] = False  # the NULL page
        held = int(np.count_nonzero(view.holders[used] > 0))
        if m.free_pages(name) + held != binding.pages - 1:
            out.append(f"{name}: {m.free_pages(name)} free + {held} indexed != {binding.pages - 1} pages")
        if np.any(view.leases) or np.any(view.copies) or any(o is not None for o in view.owners):
            out.append(f"{name}: pages still pinned or owned")
    return out


def stress(m: CacheManager, seed: int) -> list[Tally]:
    """WORKERS request loops and one evictor on one manager; re-raises the first worker error."""
    heads, done = prompts(m.layout), threading.Event()
    tallies = [Tally() for _ in range(WORKERS)]

    def worker(w: int) -> None:
        rng = np.random.default_rng([seed, w])
        for _ in range(ITERATIONS):
            if done.is_set():
                return  # another worker failed
            serve(m, rng, heads, tallies[w])

    def evictor() -> None:
        rng = np.random.default_rng([seed, WORKERS])
        while not done.is_set():
            m.evict(max_units=[1, 4, None][int(rng.integers(3))])
            time.sleep(EVICT_PAUSE_S)

    with ThreadPoolExecutor(WORKERS + 1) as pool:
        evicting = pool.submit(evictor)
        try:
            for future in [pool.submit(worker, w) for w in range(WORKERS)]:
                future.result()
        finally:
            done.set()
        evicting.result()
    return tallies


def break_release() -> None:
    """A deliberately broken manager (in this forked child only): release forgets the request's lease list
    before unpinning, so its pins stay on the pages."""
    original = release_module.release

    def release(core: Core, req: RequestState) -> None:
        req.pins.clear()
        original(core, req)

    release_module.release = release


def child(conn: Connection, layout_name: str, seed: int, broken: bool = False) -> None:
    """Run one stress in this (forked) process and send back what went wrong and the counts."""
    try:
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        block_tokens, config = SETUPS[layout_name]
        m = CacheManager(Layout.from_preset(layout_name, block_tokens=block_tokens), config)
        if broken:
            break_release()
        tallies = stress(m, seed)
        left = sorted(m.core.requests.by_rid)
        problems = [f"requests left: {left}"] if left else []
        problems += check_invariants(m) + leaks(m) + stale_problems(tallies)
        if sum(t.served + t.rejected for t in tallies) != WORKERS * ITERATIONS:
            problems.append("some iterations neither served nor rejected a request")
        m.evict()
        problems += [f"{b.name}: pages left after evicting everything" for b in m.bindings()
                     if m.free_pages(b.name) != b.pages - 1]
        if m.index_counts() != {"blocks": 0, "points": 0, "keys": 0}:
            problems.append(f"entries left in the index after evicting everything: {m.index_counts()}")
        counts = {k: sum(getattr(t, k) for t in tallies)
                  for k in ("served", "hits", "out_of_pages", "rejected", "plans", "steps")}
        stale = Counter(err.pool if err.pool in ("block", "resume_point") else "page"
                        for t in tallies for _, err in t.stale)
        conn.send({"problems": problems, "stale": dict(stale), **counts})
    except BaseException:
        conn.send({"problems": [traceback.format_exc()]})
    finally:
        conn.close()


def run_isolated(layout_name: str, seed: int, broken: bool = False) -> dict[str, Any]:
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=child, args=(send, layout_name, seed, broken), daemon=True)
    proc.start()
    try:
        if not receive.poll(RUN_TIMEOUT_S):
            pytest.fail(f"{layout_name} seed {seed}: no result after {RUN_TIMEOUT_S} s (a manager call never returned)")
        result: dict[str, Any] = receive.recv()
        return result
    finally:
        proc.kill()
        proc.join()


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("layout_name", list(SETUPS))
def test_threads_share_one_manager(layout_name: str, seed: int) -> None:
    result = run_isolated(layout_name, seed)
    assert result["problems"] == [], "\n".join(result["problems"][:10])
    assert result["hits"] > 0, "shared prefixes never hit"
    assert result["plans"] > 0, "no copy plan was run (tail seeds follow every hit on these layouts)"
    assert result["steps"] > 0, "no speculative step ran"
    print(f"{layout_name} seed {seed}: {result}")


def test_stress_catches_a_manager_that_leaks_pins() -> None:
    """The same run with a release that keeps pins and pages must report problems."""
    result = run_isolated("tiny_v4", 0, broken=True)
    assert any("pinned or owned" in p for p in result["problems"]), result["problems"][:3]
