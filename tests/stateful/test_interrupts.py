"""A KeyboardInterrupt (Ctrl-C: SIGINT) landing anywhere inside a manager call never tears the manager.

Each call of a V4-Flash serving step is run once to count its trace events, then again on a fresh clone with
SIGINT raised at one of many of those events (`sys.settrace`; Python runs the handler at the next bytecode,
exactly where a real Ctrl-C lands).  Every time, the invariants hold and the snapshot is either the one before
the call or the one its uninterrupted run leaves: the interrupt landed before anything changed, or after all of
it (docs/manager.md, "Interrupts").  A second test interrupts a serving loop from a timer thread
(`_thread.interrupt_main`), as the issue's trial did.
"""

from __future__ import annotations

import _thread
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import numpy as np
import pytest

from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig, OutOfPages, check_invariants
from hkv_core.plan import Completion
from hkv_core.testing.serving import serve_whole

POINTS = 48  # interrupt points tried per call, spread over its trace events
Call = Callable[[CacheManager], object]

pytestmark = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                                reason="signals are delivered to the main thread only")


@pytest.fixture(autouse=True)
def python_sigint() -> Iterator[None]:
    """Python's own Ctrl-C handler, even when the run inherited SIGINT ignored (a background shell)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def flash() -> CacheManager:
    return CacheManager(Layout.from_preset("deepseek_v4_flash", block_tokens=16),
                        ManagerConfig(default_pool_pages=22, key_seed=3, retain_every_blocks=2,
                                      evict_slack_shift=None))


def serve(m: CacheManager, tokens: np.ndarray) -> None:
    serve_whole(m, tokens)


def traced(call: Call, m: CacheManager, at: int | None) -> tuple[int, bool]:
    """Run `call(m)` under a tracer that raises SIGINT at trace event `at` (None: never); (events, interrupted)."""
    seen = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal seen
        seen += 1
        if seen == at:
            signal.raise_signal(signal.SIGINT)
        return tracer

    sys.settrace(tracer)
    try:
        call(m)
    except KeyboardInterrupt:
        return seen, True
    finally:
        sys.settrace(None)
    return seen, False


def scenario() -> list[tuple[str, CacheManager, Call]]:
    """(name, the manager just before the call, the call): every verb of a serving loop, eviction included."""
    rng = np.random.default_rng(5)
    shared = rng.integers(0, 1000, 160)
    steps: list[tuple[str, CacheManager, Call]] = []
    m = flash()
    serve(m, shared)
    serve(m, rng.integers(0, 1000, 96))
    prompt = np.concatenate([shared[:112], rng.integers(0, 1000, 60)])

    def step(name: str, call: Call) -> Any:
        steps.append((name, m.clone(), call))
        return call(m)

    rid = step("add_request", lambda x: x.add_request(prompt))
    hit = m.match(rid)
    steps.append(("match", m.clone(), lambda x: x.match(rid)))
    step("acquire", lambda x: x.acquire(rid, hit))
    alloc = step("allocate", lambda x: x.allocate(rid, 40))
    assert alloc.plan is not None, "the hit ends inside a page: a copy plan"
    plan_id = alloc.plan.plan_id
    step("complete", lambda x: x.complete(plan_id, Completion()))
    step("commit", lambda x: x.commit(rid, 40))
    step("append_tokens", lambda x: x.append_tokens(rid, list(range(30))))
    rest = m.request_tokens(rid)[2] - m.request_tokens(rid)[1]
    step("allocate (evicts)", lambda x: x.allocate(rid, rest))  # the pools are short: eviction runs first
    assert m.stats["evictions"] >= 1
    step("commit (rest)", lambda x: x.commit(rid, rest))
    proposed = step("propose", lambda x: x.propose(rid, [1, 2, 3]))
    if proposed.plan is not None:  # the checkpoint copy of the working tail
        m.complete(proposed.plan.plan_id, Completion())
    step("accept", lambda x: x.accept(rid, 2))
    step("commit (accepted)", lambda x: x.commit(rid, 2))
    proposed = step("propose again", lambda x: x.propose(rid, [4, 5]))
    if proposed.plan is not None:
        m.complete(proposed.plan.plan_id, Completion())
    step("reject", lambda x: x.reject(rid))
    step("release", lambda x: x.release(rid))
    step("evict", lambda x: x.evict(3))
    return steps


STEPS = scenario()


@pytest.mark.parametrize("index", range(len(STEPS)), ids=[name for name, _, _ in STEPS])
def test_an_interrupt_anywhere_in_a_call_leaves_the_state_before_or_after_it(index: int) -> None:
    _, base, call = STEPS[index]
    before = base.snapshot()
    done = base.clone()
    events, interrupted = traced(call, done, None)
    assert not interrupted and check_invariants(done) == []
    after = done.snapshot()
    assert after != before or index == 1  # match changes nothing
    torn: list[str] = []
    points = sorted({1 + (events - 1) * i // (POINTS - 1) for i in range(POINTS)})
    for at in points:
        m = base.clone()
        _, interrupted = traced(call, m, at)
        try:
            broken = check_invariants(m)
        except Exception as err:  # a torn table can break the checker itself
            broken = [f"check_invariants raised {err!r}"]
        state = m.snapshot()
        if broken or state not in (before, after):
            torn.append(f"event {at}/{events}: {'; '.join(broken[:2]) or 'a state neither before nor after'}")
        elif not interrupted and state != after:
            torn.append(f"event {at}/{events}: not interrupted, yet not the call's result")
    assert not torn, torn[:3]


def test_ctrl_c_from_a_timer_never_tears_a_serving_loop() -> None:
    """The issue's trial: requests served in a loop, `interrupt_main` at a random moment (here 1-40 ms)."""
    rng = random.Random(11)
    tokens = np.random.default_rng(0)
    torn = []
    for trial in range(12):
        m = flash()
        timer = threading.Timer(rng.uniform(0.001, 0.04), _thread.interrupt_main)
        timer.start()
        try:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                try:
                    serve(m, tokens.integers(0, 50, int(tokens.integers(20, 200))))
                except OutOfPages:
                    m.evict()
        except KeyboardInterrupt:
            pass
        finally:
            timer.cancel()
            timer.join()
        try:
            broken = check_invariants(m)
        except Exception as err:
            broken = [f"check_invariants raised {err!r}"]
        if broken:
            torn.append(f"trial {trial}: {broken[:2]}")
    assert not torn, torn
