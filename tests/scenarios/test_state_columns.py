"""State columns (an engine's recurrent state per block column, vLLM's Mamba groups): hits resume only where a
step ended on a block boundary, and read exactly the state there.

A model of vLLM's worker drives the manager: a step over tokens [start, end) copies the state from the column the
request last wrote (or the hit's) into column (end - 1) // T, then writes the state after `end` there.  Every hit
must read a page holding the state of the hitting request's own first P tokens."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import pytest

from hkv_core.errors import InvalidRequestState
from hkv_core.layout import EngineGroup, engine_layout
from hkv_core.manager import CacheManager, ManagerConfig, check_invariants
from hkv_core.manager.roles import state

T = 16  # tokens per block


def _manager(pages: int = 40) -> CacheManager:
    groups = [EngineGroup(window_tokens=0, tokens_per_page=T, kv_dtype="fp32", num_kv_heads=1, head_dim=4, state=True),
              EngineGroup(window_tokens=0, tokens_per_page=T, kv_dtype="fp16", num_kv_heads=1, head_dim=4)]
    layout, _ = engine_layout(groups, name="mamba", block_tokens=T, pool_per_group=True, alignment_bytes=16,
                              source="test")
    return CacheManager(layout, ManagerConfig(shared_pages=pages, max_requests=8, max_request_tokens=512,
                                              retain_every_blocks=1))


STATE = "state.recurrent_state.column"


class Worker:
    """vLLM's worker for one state group: what each page holds (the tokens whose state it is)."""

    def __init__(self, column_tokens: int = T) -> None:
        self.page: dict[int, tuple[int, ...]] = {}
        self.wrong_reads = 0
        self.column_tokens = column_tokens

    def copy(self, src: int, dst: int) -> None:
        """A block copy the engine runs before the step (a copy on write, a snapshot)."""
        self.page[dst] = self.page.get(src, ())

    def step(self, table: list[int], tokens: list[int], prev: int, start: int, end: int) -> int:
        """Copy the state at `start` (column `prev`) into the end's column, then write the state at `end`."""
        col = (end - 1) // self.column_tokens
        assert table[col] != 0, f"column {col} of the step [{start}, {end}) is the null block"
        if start and self.page.get(table[prev]) != tuple(tokens[:start]):
            self.wrong_reads += 1
        self.page[table[col]] = tuple(tokens[:end])
        return col


def _serve(m: CacheManager, worker: Worker, tokens: list[int], chunks: list[int]) -> int:
    """One request: match, acquire, steps of `chunks` tokens (each committed, as an engine reports it), release."""
    rid = m.add_request(tokens)
    hit = m.match(rid)
    done = hit.tokens
    prev = done // T - 1
    if done:
        m.acquire(rid, hit)
    for n in chunks:
        n = min(n, len(tokens) - done)
        if n <= 0:
            break
        allocated = m.request_tokens(rid)[1]
        if done + n > allocated:  # whole blocks, as vLLM allocates them
            m.allocate_ahead(rid, min(-(-(done + n) // T) * T, len(tokens)) - allocated)
        table = list(m.tables(rid)[STATE])
        prev = worker.step(table, tokens, prev, done, done + n)
        m.commit(rid, n)
        done += n
        assert check_invariants(m) == []
    m.release(rid)
    return hit.tokens


def _workload(m: CacheManager, seed: int) -> tuple[Worker, int]:
    rng, worker, hits = random.Random(seed), Worker(), 0
    prefixes = [[rng.randrange(1, 1000) for _ in range(rng.randrange(20, 120))] for _ in range(3)]
    for _ in range(30):
        tokens = rng.choice(prefixes) + [rng.randrange(1, 1000) for _ in range(rng.randrange(1, 60))]
        chunks = [rng.choice([1, 5, T, 2 * T, 40, 100]) for _ in range(60)]
        hits += _serve(m, worker, tokens, chunks)
    return worker, hits


@pytest.mark.parametrize("seed", range(6))
def test_every_hit_reads_the_state_at_its_point(seed: int) -> None:
    worker, hits = _workload(_manager(), seed)
    assert worker.wrong_reads == 0
    assert hits > 0


def test_a_point_only_where_a_step_ended_on_a_block_boundary() -> None:
    m, worker = _manager(), Worker()
    tokens = list(range(1, 101))
    _serve(m, worker, tokens, [32, 68])  # steps end at 32 and 100: the state at 64 never exists
    assert m.match(m.add_request(tokens[:70])).tokens == 32
    _serve(m, worker, tokens[:70], [100])  # resumes at 32, ends at 70
    assert m.match(m.add_request(tokens + [7])).tokens == 32


def test_an_allocation_takes_one_page_for_the_column_of_its_last_token() -> None:
    m = _manager()
    rid = m.add_request(list(range(1, 101)))
    alloc = m.allocate_ahead(rid, 100)
    assert alloc.block_tables[STATE].tolist() == [0] * 6 + [alloc.block_tables[STATE][6]]
    assert alloc.block_tables[STATE][6] != 0


def test_speculative_steps_are_refused_by_name() -> None:
    m = _manager()
    rid = m.add_request(list(range(1, 40)))
    m.allocate_ahead(rid, 39)
    m.commit(rid, 39)
    with pytest.raises(InvalidRequestState, match="speculative steps over state columns"):
        m.propose(rid, [1, 2, 3])
    assert check_invariants(m) == []


def test_broken_variant_a_point_at_a_boundary_a_step_crossed_reads_a_stale_state(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the step-end rule, a step over [60, 70) keeps a point at 64 whose column holds the state at 60."""
    def aligned_own_columns(self: state.StateRole, req: object, due: np.ndarray, moves: object) -> np.ndarray:
        ok = np.ones(len(due), np.bool_)
        for pool in self.pools:
            ok &= (due % pool.spec.tokens_per_page == 0) & self._columns(pool, req, due)[1]  # type: ignore[arg-type]
        return ok

    monkeypatch.setattr(state.StateRole, "points_ready", aligned_own_columns)
    wrong = sum(_workload(_manager(), seed)[0].wrong_reads for seed in range(6))
    assert wrong > 0


def _prompt_end_survives_pressure() -> bool:
    """A released request's chain and a running request's prompt end: eviction needs one unit; is the running
    request's prompt-end state (where its next turn resumes) still cached after?"""
    m, worker = _manager(pages=16), Worker()
    _serve(m, worker, list(range(500, 540)), [T, T, 8])  # released: points at 16 and 32
    running = list(range(1, 65))
    rid = m.add_request(running)
    m.allocate_ahead(rid, 64)
    m.commit(rid, 64)  # the prompt's end, 64: a point
    for end in (80, 96):  # decoding, a block a commit: points at 80 and 96
        m.append_tokens(rid, list(range(end, end + T)))
        m.allocate_ahead(rid, T)
        m.commit(rid, T)
    other = m.add_request(list(range(700, 760)))
    m.allocate_ahead(other, 60)  # needs more pages than are free: eviction
    assert check_invariants(m) == []
    return m.match(m.add_request(running + [9])).tokens == 64


def test_a_running_requests_prompt_end_goes_after_released_chains() -> None:
    assert _prompt_end_survives_pressure()


def test_broken_variant_running_anchors_first_drops_the_prompt_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a window's order (a running request's passed anchors first) the state its next turn needs goes."""
    from hkv_core.manager import evict

    monkeypatch.setattr(evict, "STATE_PASSES", evict.PASSES)
    assert not _prompt_end_survives_pressure()


def _junction_survives_pressure() -> bool:
    """Two running requests branch at a shared prefix's end (a junction: where the next one arrives); a third
    allocation needs one page more than is free, and only the junction's state could give it.  Is the junction
    still a hit after (the allocation refused instead: vLLM then preempts, as it would with its own manager)?"""
    from hkv_core.errors import OutOfPages

    m = _manager(pages=16)
    shared = list(range(1, 33))
    for own in (100, 200):
        rid = m.add_request(shared + list(range(own, own + 32)))
        hit = m.match(rid)
        if hit.tokens:
            m.acquire(rid, hit)
        for _ in range((64 - hit.tokens) // 32):  # steps of two blocks: points at 32 and 64 only
            m.allocate_ahead(rid, 32)
            m.commit(rid, 32)
    free = m.free_pages(STATE)
    other = m.add_request(list(range(700, 700 + free * T)))  # free attention pages and one state page: one short
    with contextlib.suppress(OutOfPages):  # (refused: nothing changed)
        m.allocate_ahead(other, free * T)
    assert check_invariants(m) == []
    return m.match(m.add_request(shared + [9, 9, 9])).tokens == 32


def test_a_junction_of_running_requests_is_kept_under_pressure() -> None:
    assert _junction_survives_pressure()


def test_broken_variant_a_junction_of_running_requests_evicted_for_an_allocation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the window's last pass (every running request's points, junctions too) the junction goes: the next
    turns of every branch recompute the shared prefix (vLLM's own manager keeps it: it preempts instead)."""
    from hkv_core.manager import evict

    monkeypatch.setattr(evict, "STATE_PASSES", (evict.PASSES[0], evict.PASSES[2], evict.PASSES[3]))
    assert not _junction_survives_pressure()


def test_broken_variant_a_step_computing_in_a_kept_state_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """`snapshots_unshared` for state columns: the column a request's next tokens write is never a resume
    point's state.  Broken: the next block's column reuses the page of the point just kept (no new page)."""
    from hkv_core.manager.roles.base import NO_DEMAND

    m = _manager()
    rid = m.add_request(list(range(1, 60)))
    m.allocate_ahead(rid, 32)
    m.commit(rid, 32)  # a point at 32: column 1's page
    assert check_invariants(m) == []

    def reuse(self: state.StateRole, req: object, start: int, end: int, boundaries: list[int]) -> list[object]:
        return [NO_DEMAND for _ in self.pools]

    def alias(self: state.StateRole, req: object, start: int, end: int, boundaries: list[int], got: list[object],
              out: object) -> None:
        for pool in self.pools:
            table = req.tables[pool.index]  # type: ignore[attr-defined]
            table.extend(table.view()[-1:], table.page_view()[-1:])

    monkeypatch.setattr(state.StateRole, "demands", reuse)
    monkeypatch.setattr(state.StateRole, "place", alias)
    m.allocate_ahead(rid, 16)
    assert any("a resume point's snapshot" in v for v in check_invariants(m))
