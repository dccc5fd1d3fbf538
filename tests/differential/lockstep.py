"""The manager state machine driving two executors in lockstep: the NumPy reference and a CudaExecutor.

`LockstepMachine` is hkv_core.testing's ManagerMachine (random requests, hits,
evictions, copy plans in flight, speculative steps) with both executors bound to
its manager.  Every allocation's new slots and working / snapshot tail pages get
the same random entries on both; every plan that completes runs on both (equal
Completions); a rule also checksums, stores, overwrites and reloads the pages of a
live request through hand-built plans.  After every step every pool's bytes must
be equal on both executors - exact, for copies, fills, stores and loads alike.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from hkv_core.errors import StaleLease
from hkv_core.manager import Allocation
from hkv_core.plan import Checksum, FillPages, LoadRecord, Plan, StoreRecord
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
    @rule(data=st.data(), fill=st.integers(0, 255))
    def store_fill_reload(self, data: st.DataObject, fill: int) -> None:
        """Checksum a live request's pages, store them, overwrite them, load them back: the same on both."""
        rid = data.draw(st.sampled_from(sorted(self.model)))
        owned = {pool: pages for pool, pages in self.manager.owned(rid).items() if pages}
        if not owned:
            return
        pool = data.draw(st.sampled_from(sorted(owned)))
        pages = owned[pool][: data.draw(st.integers(1, 3))]
        versions = [int(v) for v in self.manager.pages(pool, pages).versions]
        record = f"r{self.round_trips}"
        ops = (Checksum(pool=pool, pages=pages, versions=versions),
               StoreRecord(pool=pool, pages=pages, versions=versions, record=record),
               FillPages(pool=pool, pages=pages, versions=versions, value=fill),
               Checksum(pool=pool, pages=pages, versions=versions),
               LoadRecord(pool=pool, pages=pages, versions=versions, record=record))
        plan = Plan(ops=ops, request_id=rid)
        outcomes = []
        for executor in (self.ref, self.other):
            try:
                outcomes.append(executor.run(plan))
            except StaleLease as err:
                outcomes.append(("stale", err.fields))
        assert outcomes[0] == outcomes[1], f"completions differ: {plan.describe()}: {outcomes}"
        self.round_trips += 1

    @invariant()
    def pools_agree(self) -> None:
        bad = differing_pools(self.ref, self.other)
        assert not bad, f"pools differ between the reference and the {self.other.backend.name} executor: {bad}"


def make_lockstep_machine(backend_factory: Any, layout_name: str, **config: Any) -> type[LockstepMachine]:
    base = make_manager_machine(layout_name, **config)
    return type(f"Lockstep_{base.__name__}", (LockstepMachine, base),
                {"backend_factory": staticmethod(backend_factory)})
