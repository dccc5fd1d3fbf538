"""A decode step captured over static block tables survives an eviction to host and a reload (F9).

On the NumPy stand-in "capture" records the step and replay re-runs it, which
checks the host-side logic (static tables rewritten in place, address checks);
under the gpu marker the same test captures a real CUDA Graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from backends import BACKENDS

from hkv_core.errors import GraphAddressChanged, HkvError
from hkv_core.executor import TrustingAuthority
from hkv_core.plan import FillPages, LoadRecord, Plan, StoreRecord
from hkv_exec_cuda import CudaExecutor
from hkv_exec_ref import Engine
from tests.differential.graph_decode_step import DecodeReads, attention_from_state, random_queries

PROMPT_TOKENS = 70
P = 64  # a retained boundary; (P + 1) % r != 0 for r = 4 and 8: the query's own block is still open


def served_step(backend_factory: Any) -> tuple[Engine, int, DecodeReads]:
    """An engine on the backend serves a prompt; a second request holds its prefix at P; the step reads it."""
    engine = Engine.tiny(0, executor=CudaExecutor(backend_factory()))
    prompt = np.random.default_rng(3).integers(0, engine.config.vocab, PROMPT_TOKENS)
    engine.generate(prompt, 2)
    m = engine.manager
    rid = m.add_request(prompt[:P + 1])
    hit = m.match(rid)
    m.acquire(rid, hit)
    assert hit.tokens == P, hit
    queries = random_queries(engine.model, seed=1)
    reads = DecodeReads(engine.executor, engine.model, engine.routes, P, m.tables(rid), queries)
    return engine, rid, reads


def reference(engine: Engine) -> list[np.ndarray]:
    """The same attention with keys from the reference model's own state at P (NumPy)."""
    prompt = np.random.default_rng(3).integers(0, engine.config.vocab, PROMPT_TOKENS)
    host_model = engine.model.on(np)
    queries = random_queries(host_model, seed=1)
    return [np.asarray(o) for o in attention_from_state(host_model, host_model.state_at(prompt, P), queries)]


def same(a: list[np.ndarray], b: list[np.ndarray], exact: bool) -> bool:
    if exact:
        return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    return all(np.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(a, b, strict=True))


RECORDS: dict[int, dict[str, np.ndarray]] = {}  # per engine: the host bytes of its pages' records


def round_trip(engine: Engine, rid: int, fill: int, *, reload: bool) -> None:
    """Evict: store every page the request reads to host records and scribble over them (the pages reused);
    `reload`: load the records back instead.  The plan is built by hand (a page evicted and reloaded into the
    same place is what the graph must survive, not a manager flow: the manager issues a load only into pages a
    request reserved), so it runs under a trusting authority."""
    ops: list[Any] = []
    records = RECORDS.setdefault(id(engine), {})
    for pool, pages in engine.manager.tables(rid).items():
        pages = sorted({p for p in pages if p})
        if not pages:
            continue
        versions = [int(v) for v in engine.manager.pages(pool, pages).versions]
        array = engine.executor.pools[pool]
        runs = [(page, 0, array.shape[2]) for page in pages]
        records.setdefault(pool, np.zeros(len(pages) * array[0].nbytes, np.uint8))
        record = {"pool": pool, "runs": runs, "versions": versions, "record": pool}
        ops += ([LoadRecord(**record)] if reload
                else [StoreRecord(**record), FillPages(pool=pool, pages=pages, versions=versions, value=fill)])
    executor, authority = engine.executor, engine.executor._authority
    executor._authority = TrustingAuthority()
    try:
        executor.run(Plan(ops=ops, request_id=rid), records=records)
    finally:
        executor._authority = authority


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # attention over the scribbled pages overflows
@pytest.mark.parametrize("backend_factory", BACKENDS)
def test_captured_step_survives_eviction_and_reload(backend_factory: Any) -> None:
    engine, rid, reads = served_step(backend_factory)
    exact = engine.executor.backend.name == "numpy"
    eager = reads.eager()
    assert same(eager, reference(engine), exact), "the step's keys are not the model's state at P"
    graph = reads.capture()
    graph.replay()
    assert same(reads.host_outputs(), eager, exact=True), "replay differs from eager execution"
    round_trip(engine, rid, fill=0x7F, reload=False)  # evicted, pages reused: the graph reads what is there now
    graph.replay()
    assert not same(reads.host_outputs(), eager, exact=True), "the graph did not read the pools"
    round_trip(engine, rid, fill=0x7F, reload=True)  # evicted to host and reloaded into the same pages
    graph.replay()
    assert same(reads.host_outputs(), eager, exact=True), "replay after reload differs from eager execution"
    assert graph.replays == 3


@pytest.mark.parametrize("backend_factory", BACKENDS)
def test_pages_moved_elsewhere_are_followed_through_the_static_table(backend_factory: Any) -> None:
    engine, rid, reads = served_step(backend_factory)
    eager = reads.eager()
    graph = reads.capture()
    ex = engine.executor
    window = next(pool for pool in reads.tables if pool.endswith("swa_window"))
    table = engine.manager.tables(rid)[window]
    free = [p for p in range(1, ex.pools[window].shape[0]) if p not in table][:len(table)]
    moved = [free[i] if page else 0 for i, page in enumerate(table)]
    for old, new in zip(table, moved, strict=True):
        if old:
            ex.pools[window][new] = ex.pools[window][old]  # reloaded into other pages
            ex.pools[window][old] = 0
    reads.tables[window].update(moved)
    graph.replay()
    assert same(reads.host_outputs(), eager, exact=True)


@pytest.mark.parametrize("backend_factory", BACKENDS)
def test_an_address_change_is_refused_never_recaptured(backend_factory: Any) -> None:
    engine, rid, reads = served_step(backend_factory)
    graph = reads.capture()
    pool, table = next(iter(reads.tables.items()))
    with pytest.raises(GraphAddressChanged) as info:
        table.update(list(range(1, table.capacity_pages + 2)))
    assert isinstance(info.value, HkvError) and info.value.fields["found"] == table.capacity_pages + 1
    assert table.pages < table.capacity_pages + 1  # unchanged
    captured = reads.outputs[0]
    reads.outputs[0] = captured.copy()  # an output buffer swapped for another behind the graph's back
    with pytest.raises(GraphAddressChanged, match="buffer layer 0 output"):
        graph.replay()
    reads.outputs[0] = captured
    table.array = table.array.copy()  # a block table reallocated
    with pytest.raises(GraphAddressChanged, match=f"buffer table {pool}"):
        graph.replay()
    ex = engine.executor
    ex.pools[pool] = ex.pools[pool].copy()  # a pool reallocated behind the graph's back
    with pytest.raises(GraphAddressChanged, match=f"pool {pool} base address"):
        graph.replay()
    assert graph.replays == 0
