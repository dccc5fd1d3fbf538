"""State columns with points inside a column (vLLM's sub-block hits: a Mamba block of several hash blocks).

With `allow_partial_page_copy` a state pool of T-token columns keeps points on
any B-token block boundary t.  Column (t - 1) // T holds the state at t only
until a later step ending in that column overwrites it, so (roles/state.py) a
point inside a column is kept on the column's page only at a commit's end -
the page is then the request's no longer, and a later step ending there copies
it first - or on a snapshot page copied from the column before the step that
overwrites it.

A model of vLLM's worker drives the manager: each allocation's copies run
before the step (as `take_kv_cache_block_copies` hands them to vLLM's worker),
then the step copies the state from the column its request last wrote (or the
hit's) into column (end - 1) // T when they differ, and writes the state after
`end` there.  The driver commits as hkv_vllm does under vLLM's append-only
block tables: a step that ends inside a column on a block boundary is committed
there only when the request's next step leaves the column or the request ends
(else one token short, keeping no point there).  Every state a step starts from
must be the request's own first `start` tokens'.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from hkv_core.layout import EngineGroup, engine_layout
from hkv_core.manager import CacheManager, ManagerConfig, check_invariants
from hkv_core.manager.roles import state
from tests.scenarios.test_state_columns import Worker as ColumnWorker

B, T = 16, 64  # hkv's block (vLLM's hash block) and the state column (vLLM's Mamba block)
STATE = "state.recurrent_state.column"


def _manager(pages: int = 60) -> CacheManager:
    groups = [EngineGroup(window_tokens=0, tokens_per_page=B, kv_dtype="fp16", num_kv_heads=1, head_dim=4),
              EngineGroup(window_tokens=0, tokens_per_page=T, kv_dtype="fp32", num_kv_heads=1, head_dim=4, state=True)]
    layout, _ = engine_layout(groups, name="mamba", block_tokens=B, pool_per_group=True, alignment_bytes=16,
                              source="test")
    return CacheManager(layout, ManagerConfig(shared_pages=pages, max_requests=8, max_request_tokens=1024,
                                              retain_every_blocks=1, allow_partial_page_copy=True))


def Worker() -> ColumnWorker:  # noqa: N802  (the columns' worker model, with this file's columns)
    return ColumnWorker(T)


def _run_copies(m: CacheManager, worker: ColumnWorker, alloc: object, running: bool) -> None:
    """The allocation's copies, before the step (an engine whose tables only grow never replaces a running
    request's column: every copy of a running request is a snapshot, outside its table)."""
    from hkv_core.plan import Completion

    plan = alloc.plan  # type: ignore[attr-defined]
    if plan is None:
        return
    table = alloc.block_tables[STATE].tolist()  # type: ignore[attr-defined]
    for op in plan.ops:
        if op.pool.startswith("state"):
            assert not (running and op.dst in table), "a running request's column copied on write"
            worker.copy(op.src, op.dst)
    m.complete(plan.plan_id, Completion())


def _serve(m: CacheManager, worker: ColumnWorker, tokens: list[int], chunks: list[int], check: bool = True) -> int:
    """One request: match, acquire, steps of `chunks` tokens committed as hkv_vllm commits them, release."""
    rid = m.add_request(tokens)
    hit = m.match(rid)
    done = hit.tokens
    prev = (done - 1) // T if done else -1
    if done:
        m.acquire(rid, hit)
    steps = []
    for n in chunks:
        n = min(n, len(tokens) - done - sum(steps))
        if n <= 0:
            break
        steps.append(n)
    for i, n in enumerate(steps):
        allocated = m.request_tokens(rid)[1]
        if done + n > allocated:  # whole blocks, as vLLM allocates them
            alloc = m.allocate_ahead(rid, min(-(-(done + n) // B) * B, len(tokens)) - allocated, done)
            _run_copies(m, worker, alloc, running=bool(i))
        prev = worker.step(list(m.tables(rid)[STATE]), tokens, prev, done, done + n)
        done += n
        later = done + steps[i + 1] if i + 1 < len(steps) else None
        stays = later is not None and (later - 1) // T == (done - 1) // T
        computed = m.request_tokens(rid)[0]
        upto = done - 1 if done % B == 0 and done % T and stays else done  # no point where the next step writes
        if upto > computed:
            m.commit(rid, upto - computed)
        assert not check or check_invariants(m) == []
    computed = m.request_tokens(rid)[0]
    if done > computed:
        m.commit(rid, done - computed)
    m.release(rid)
    assert not check or check_invariants(m) == []
    return hit.tokens


def _workload(m: CacheManager, seed: int, check: bool = True) -> tuple[ColumnWorker, list[int]]:
    rng, worker, hits = random.Random(seed), Worker(), []
    prefixes = [[rng.randrange(1, 1000) for _ in range(rng.randrange(40, 200))] for _ in range(3)]
    for _ in range(30):
        tokens = rng.choice(prefixes) + [rng.randrange(1, 1000) for _ in range(rng.randrange(1, 80))]
        chunks = [rng.choice([1, 5, B, 2 * B, T, 40, 100]) for _ in range(80)]
        hits.append(_serve(m, worker, tokens, chunks, check))
    return worker, hits


@pytest.mark.parametrize("seed", range(6))
def test_every_hit_inside_a_column_reads_the_state_at_its_point(seed: int) -> None:
    worker, hits = _workload(_manager(), seed)
    assert worker.wrong_reads == 0
    assert any(h % T for h in hits), hits  # hits inside a column happened


def test_a_producer_that_continues_in_the_column_keeps_its_prompt_end_on_a_snapshot() -> None:
    m, worker = _manager(), Worker()
    prompt = list(range(1, 101))
    _serve(m, worker, prompt + [7, 8], [64, 32, 4, 1, 1])  # steps end at 64, 96 (inside column 1), 100, 101, 102
    again = m.add_request(prompt[:96] + [5, 5, 5])
    assert m.match(again).tokens == 96


def test_a_hit_inside_a_column_copies_it_before_the_step_writes_there() -> None:
    m, worker = _manager(), Worker()
    prompt = list(range(1, 101))
    _serve(m, worker, prompt, [64, 32])  # ends at 96: the column's page holds the state at 96, kept there
    rid = m.add_request(prompt[:96] + [5, 5, 5, 5])
    hit = m.match(rid)
    m.acquire(rid, hit)
    source = list(m.tables(rid)[STATE])[1]
    alloc = m.allocate_ahead(rid, 4)
    assert hit.tokens == 96
    assert [op.src for op in alloc.plan.ops if op.pool.startswith("state")] == [source]
    assert alloc.block_tables[STATE].tolist()[1] != source


def test_without_partial_page_copy_points_stay_on_column_ends() -> None:
    groups = [EngineGroup(window_tokens=0, tokens_per_page=B, kv_dtype="fp16", num_kv_heads=1, head_dim=4),
              EngineGroup(window_tokens=0, tokens_per_page=T, kv_dtype="fp32", num_kv_heads=1, head_dim=4, state=True)]
    layout, _ = engine_layout(groups, name="mamba", block_tokens=B, pool_per_group=True, alignment_bytes=16,
                              source="test")
    m = CacheManager(layout, ManagerConfig(shared_pages=60, max_requests=8, max_request_tokens=1024,
                                           retain_every_blocks=1, allow_partial_page_copy=False))
    prompt = list(range(1, 101))
    _serve(m, Worker(), prompt, [64, 32])
    assert m.match(m.add_request(prompt[:96] + [5])).tokens == 64


def test_broken_variant_no_copy_on_write_of_a_kept_column(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step ending in a column whose page a point refers to writes that page: the point reads a later state, and
    check_invariants reports a request computing in a resume point's snapshot."""
    monkeypatch.setattr(state.StateRole, "_writes_new",
                        lambda self, req, pool, last: last >= len(req.tables[pool.index]))
    assert sum(_workload(_manager(), seed, check=False)[0].wrong_reads for seed in range(6)) > 0
    with pytest.raises(AssertionError, match="a resume point's snapshot"):
        _workload(_manager(), 0)


def test_broken_variant_a_snapshot_never_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot page that no copy fills: a hit at the producer's prompt end reads nothing."""
    real = state.StateRole.place

    def place_without_snapshot_copy(self: state.StateRole, req: object, start: int, end: int, boundaries: list[int],
                                    got: list[np.ndarray], out: object) -> None:
        copies = list(out.copies)  # type: ignore[attr-defined]
        real(self, req, start, end, boundaries, got, out)  # type: ignore[arg-type]
        added = out.copies[len(copies):]  # type: ignore[attr-defined]
        snapshots = set(req.snapshots.get(self.pools[0].index, []))  # type: ignore[attr-defined]
        pages = {int(self.objects.slot[o]) for o in snapshots}
        out.copies[len(copies):] = [op for op in added if op.dst not in pages]  # type: ignore[attr-defined]
        out.fills[:] = [f for f in out.fills if f not in snapshots]  # type: ignore[attr-defined]

    monkeypatch.setattr(state.StateRole, "place", place_without_snapshot_copy)
    assert sum(_workload(_manager(), seed, check=False)[0].wrong_reads for seed in range(6)) > 0


@pytest.mark.parametrize("bad", [-1, 200, 1.5, "16", True])
def test_a_step_start_outside_committed_allocated_is_refused(bad: object) -> None:
    from hkv_core.errors import InvalidRequestArgument

    m = _manager()
    rid = m.add_request(list(range(1, 101)))
    m.allocate_ahead(rid, 32)
    before = m.request_tokens(rid), m.free_pages(STATE)
    with pytest.raises(InvalidRequestArgument, match="step_start"):
        m.allocate_ahead(rid, 16, bad)  # type: ignore[arg-type]
    assert (m.request_tokens(rid), m.free_pages(STATE)) == before
    assert check_invariants(m) == []
