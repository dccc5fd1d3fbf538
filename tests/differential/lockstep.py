"""The manager state machine driving two executors in lockstep: the NumPy reference and a CudaExecutor.

`LockstepMachine` is hkv_core.testing's ManagerMachine (random requests, hits,
evictions, copy plans in flight, speculative steps) with both executors bound to
its manager.  Every allocation's new slots and working / snapshot tail pages get
the same random entries on both; every plan that completes runs on both (equal
Completions); a rule also stores rows of a live request's pages into a tier record
and loads other bytes into its reserved pages, through plans the manager issues
and `complete` settles (a tier's only path).  After every step every pool's bytes,
and every record's, must be equal on both executors - exact, for copies, fills,
stores and loads alike.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from hkv_core.errors import IllegalTransition, InvalidArgument, StaleLease
from hkv_core.manager import Allocation
from hkv_core.plan import Checksum, Completion, FillPages, Plan, RecordRows
from hkv_core.testing.manager_machine import ManagerMachine, make_manager_machine
from hkv_exec_cuda import Backend, CudaExecutor
from hkv_exec_ref import RefExecutor

SMALL_STAGING_BYTES = 4096  # forces the staging buffer's pieces even on the tiny layouts


def pool_bytes(executor: Any, pool: str) -> np.ndarray:
    """A pool's bytes on the host (whatever module the executor's arrays live in)."""
    return np.asarray(executor.read(pool, np.arange(executor.pools[pool].shape[0]))).view(np.uint8)


def differing_pools(ref: RefExecutor, other: Any) -> list[str]:
    return [name for name in ref.pools if not np.array_equal(pool_bytes(ref, name), pool_bytes(other, name))]


class LockstepMachine(ManagerMachine):
    """ManagerMachine + RefExecutor + CudaExecutor(backend), compared after every step."""

    backend_factory: ClassVar[Any] = None  # () -> Backend

    def __init__(self) -> None:
        super().__init__()
        self.ref = RefExecutor()
        backend: Backend = type(self).backend_factory()
        self.other = CudaExecutor(backend, staging_bytes=SMALL_STAGING_BYTES)
        bindings = self.manager.bindings()
        self.ref.bind(bindings, self.manager)
        self.other.bind(bindings, self.manager)
        self.rng = np.random.default_rng(0)
        self.round_trips = 0
        self.loads = 0

    def _write_both(self, pool: str, slots: np.ndarray) -> None:
        if slots.size == 0:
            return
        shape = self.ref.pools[pool].shape
        values = self.rng.integers(0, 1 << 16, (slots.size, shape[1], *shape[3:])).astype(self.ref.pools[pool].dtype)
        self.ref.write(pool, slots, values)
        self.other.write(pool, slots, values)

    def _check_allocation(self, rid: int, alloc: Allocation) -> None:
        super()._check_allocation(rid, alloc)
        for pool, slots in alloc.slots.items():
            self._write_both(pool, np.asarray(slots, np.int64))
        pages = [*alloc.tail_pages.items(), *(item for snap in alloc.snapshots.values() for item in snap.items())]
        for pool, page in dict(pages).items():
            per_page = self.entries_per_page[pool]
            self._write_both(pool, page * per_page + np.arange(per_page, dtype=np.int64))

    def _complete(self, plan_id: int, ok: bool = True) -> None:
        plan = self.in_flight[plan_id][1]
        if ok:
            got = self.ref.run(plan), self.other.run(plan)
            assert got[0] == got[1], f"plan {plan_id}: completions differ: {got}"
        super()._complete(plan_id, ok)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def store_and_load_through_plans(self, data: st.DataObject) -> None:
        """A tier's path: store rows of a live request's pages into a record by a plan the manager issues (the
        record's bytes equal on both executors), then, where the request has reserved pages it has not
        committed, load other bytes into them by a manager-issued load plan, settled by `complete` (the
        executors' completions equal; sometimes reported failed, as a failing copy would be)."""
        rid = data.draw(st.sampled_from(sorted(self.model)))
        owned = {pool: pages for pool, pages in self.manager.owned(rid).items() if pages}
        if not owned:
            return
        pool = data.draw(st.sampled_from(sorted(owned)))
        pages = owned[pool][: data.draw(st.integers(1, 3))]
        per_page = self.entries_per_page[pool]
        first = data.draw(st.integers(0, per_page - 1))
        self._fill_and_checksum(rid, pool, pages, data.draw(st.integers(0, 255)))
        record = f"r{self.round_trips}"
        rows = [RecordRows(pool=pool, runs=[(page, first, per_page) for page in pages], record=record)]
        nbytes = len(pages) * (per_page - first) * self.ref.pools[pool][0, :, 0].nbytes
        try:
            store = self.manager.plan_store(rid, rows)
        except InvalidArgument:
            return  # a page it may not read now (a copy still fills it)
        buffers = [{record: np.zeros(nbytes, np.uint8)} for _ in range(2)]
        got = [executor.run(store, records=b) for executor, b in zip((self.ref, self.other), buffers, strict=True)]
        assert got[0] == got[1], f"completions differ: {store.describe()}: {got}"
        assert np.array_equal(buffers[0][record], buffers[1][record]), f"tier bytes differ: {store.describe()}"
        self.round_trips += 1
        try:
            load = self.manager.plan_load(rid, rows)
        except (InvalidArgument, IllegalTransition):
            return  # nothing reserved and uncommitted there
        source = self.rng.integers(0, 256, nbytes, dtype=np.uint8)
        got = [executor.run(load, records={record: source.copy()}) for executor in (self.ref, self.other)]
        assert got[0] == got[1], f"completions differ: {load.describe()}: {got}"
        failed = data.draw(st.booleans())
        self.manager.complete(load.plan_id, Completion(ok=False, error="injected") if failed else got[0])
        self.loads += 1

    def _fill_and_checksum(self, rid: int, pool: str, pages: list[int], fill: int) -> None:
        """A hand-built plan over the pages: checksum, fill, checksum (the same outcome on both, stale or not)."""
        versions = [int(v) for v in self.manager.pages(pool, pages).versions]
        plan = Plan(ops=(Checksum(pool=pool, pages=pages, versions=versions),
                         FillPages(pool=pool, pages=pages, versions=versions, value=fill),
                         Checksum(pool=pool, pages=pages, versions=versions)), request_id=rid)
        outcomes: list[Any] = []
        for executor in (self.ref, self.other):
            try:
                outcomes.append(executor.run(plan))
            except StaleLease as err:
                outcomes.append(("stale", err.fields))
        assert outcomes[0] == outcomes[1], f"completions differ: {plan.describe()}: {outcomes}"

    @invariant()
    def pools_agree(self) -> None:
        bad = differing_pools(self.ref, self.other)
        assert not bad, f"pools differ between the reference and the {self.other.backend.name} executor: {bad}"


def make_lockstep_machine(backend_factory: Any, layout_name: str, **config: Any) -> type[LockstepMachine]:
    base = make_manager_machine(layout_name, **config)
    return type(f"Lockstep_{base.__name__}", (LockstepMachine, base),
                {"backend_factory": staticmethod(backend_factory)})
