"""RefExecutor: the NumPy reference executor, the oracle other executors are compared with.

Every pool is one NumPy array allocated at `bind` and never reallocated
(static pools: `addresses()` stays what `bind` returned, whatever runs).
Every op is implemented plainly; the host tier is a dict of page copies.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hkv_core import executor_checks as _checks
from hkv_core.errors import InvalidArgument, MissingDependency, UnknownPool
from hkv_core.executor import (
    PlanAuthority,
    PoolBinding,
    Run,
    adopt_buffers,
    available_host_bytes,
    check_op,
    check_pools_fit,
    checked_max_bytes,
    device_estimate,
    record_view,
)
from hkv_core.executor_checks import bf16_bits
from hkv_core.executor_tally import NUMPY_DTYPES, Tally, pages_moved
from hkv_core.plan import Checksum, Completion, CopyPages, FillPages, LoadRecord, Plan, StoreRecord, page_digest

__all__ = ["NUMPY_DTYPES", "RefExecutor", "Tally", "bf16_bits", "pages_moved"]



class RefExecutor:
    """Executor protocol over NumPy arrays; see hkv_core.executor for the contract."""

    xp: Any = np  # the array module of the pools

    def __init__(self) -> None:
        self.pools: dict[str, NDArray[Any]] = {}
        self.bindings: dict[str, PoolBinding] = {}
        self.tally = Tally()
        self._tally_lock = threading.Lock()  # row copies may run on a tier's threads
        self._authority: PlanAuthority | None = None
        self._addresses: dict[str, int] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}  # each pool's shape and item size, fixed at bind
        self._itemsizes: dict[str, int] = {}

    # -- bind -----------------------------------------------------------------------------

    def bind(self, pools: Sequence[PoolBinding], authority: PlanAuthority, *, max_bytes: int | None = None,
             buffers: Mapping[str, Any] | None = None) -> dict[str, int]:
        """Allocate every pool (zeroed) once and keep the plans' authority.

        `buffers` ({pool: array}): pools the engine owns - CPU torch tensors, NumPy arrays, anything exporting
        DLPack - adopted without a copy (`np.from_dlpack`; checked by `hkv_core.executor.adopt_buffers`:
        BufferMismatch naming the pool and the check) and zeroed like allocated ones; the executor allocates the
        rest.  Before anything is allocated, the bytes of the pools to allocate are compared with `max_bytes`
        (when given) and the host memory available now: PoolsTooLarge, naming the pools and the bytes needed,
        when they cannot fit.  A second bind is InvalidExecutorState (pools are static), pools that are not
        PoolBindings with unique names InvalidArgument.  Any error leaves the executor unbound and the buffers
        untouched."""
        _checks.check_bind("bind", self.pools, pools)
        limit = checked_max_bytes("bind", max_bytes)
        adopted = adopt_buffers(pools, buffers, from_dlpack=np.from_dlpack, address=_address,
                                dtype_of=lambda b: np.dtype(NUMPY_DTYPES[b.spec.dtype]))
        check_pools_fit(device_estimate([b for b in pools if b.name not in adopted]),
                        [(limit, "max_bytes"), (available_host_bytes(), "host memory available (MemAvailable)")])
        for binding in pools:
            if binding.name in adopted:
                adopted[binding.name][...] = 0
                self.pools[binding.name] = adopted[binding.name]
            else:
                self.pools[binding.name] = np.zeros(binding.shape, NUMPY_DTYPES[binding.spec.dtype])
            self.bindings[binding.name] = binding
        self._authority = authority
        self._addresses = self.addresses()
        self._shapes = {name: array.shape for name, array in self.pools.items()}
        self._itemsizes = {name: array.itemsize for name, array in self.pools.items()}
        return dict(self._addresses)

    def addresses(self) -> dict[str, int]:
        """Base address of every pool's buffer right now."""
        return {name: _address(array) for name, array in self.pools.items()}

    # -- run ------------------------------------------------------------------------------

    def run(self, plan: Plan, records: Mapping[str, NDArray[Any]] | None = None) -> Completion:
        """Check every op (names, pages, record buffers), have the authority verify the versions at launch, then
        run in order; `records`: the host buffers of the record ops, by name.

        InvalidExecutorState before `bind`; UnknownPool / InvalidArgument for a malformed op (nothing runs)."""
        _checks.check_bound("run", self._authority)
        if not isinstance(plan, Plan):
            raise InvalidArgument(action="run", argument="plan", value=plan,
                                  reason=f"must be a hkv_core.plan.Plan, got {type(plan).__name__}")
        assert self._authority is not None
        buffers = records or {}
        for op in plan.ops:
            check_op(op, self._shapes, buffers, self._itemsizes)
        self._authority.verify(plan)
        digests, moved, copied = [], 0, 0
        for op in plan.ops:
            result = _RUNNERS[type(op)](self, op, buffers)
            if isinstance(op, Checksum):
                digests.append(result)
            moved += pages_moved(op)
            copied += op.entries if isinstance(op, CopyPages) else 0
        self.tally.plans += 1
        self.tally.ops += len(plan.ops)
        self.tally.pages_moved += moved
        self.tally.entries_copied += copied
        assert all(self._addresses[op.pool] == _address(self.pools[op.pool]) for op in plan.ops), \
            "a pool moved: pools are static"
        return Completion(digests=tuple(digests), ops_run=len(plan.ops), pages_moved=moved, entries_copied=copied)

    def _copy(self, op: CopyPages, records: Mapping[str, NDArray[Any]]) -> None:
        pool = self.pools[op.pool]
        pool[op.dst, :, : op.entries] = pool[op.src, :, : op.entries]

    def _fill(self, op: FillPages, records: Mapping[str, NDArray[Any]]) -> None:
        pool = self.pools[op.pool]
        for page in op.pages:
            pool[page].view(np.uint8)[...] = op.value

    def _checksum(self, op: Checksum, records: Mapping[str, NDArray[Any]]) -> tuple[str, ...]:
        pool = self.pools[op.pool]
        return tuple(page_digest(np.ascontiguousarray(pool[page]).tobytes()) for page in op.pages)

    def _store(self, op: StoreRecord, records: Mapping[str, NDArray[Any]]) -> None:
        array = self.pools[op.pool]
        self.export_rows(op.pool, op.runs, record_view(op, array.shape, array.dtype, records[op.record]))

    def _load(self, op: LoadRecord, records: Mapping[str, NDArray[Any]]) -> None:
        array = self.pools[op.pool]
        self.import_rows(op.pool, op.runs, record_view(op, array.shape, array.dtype, records[op.record]))

    # -- zero-copy views ------------------------------------------------------------------

    def as_numpy(self, pool: str) -> NDArray[Any]:
        """The pool's own array, no copy and writable: what an engine's kernels write KV into.

        Shape `PoolBinding.shape`; a bf16 pool is its raw bits as uint16.  Writes through the view
        are the pool's bytes (`read` sees them); page 0, the NULL page, must stay untouched.
        """
        return self._pool(pool, "as_numpy")

    def _pool(self, pool: str, action: str) -> NDArray[Any]:
        """The pool's array; UnknownPool (listing the bound pools; none before `bind`) for any other name,
        or a non-string."""
        if not isinstance(pool, str) or pool not in self.pools:
            raise UnknownPool(pool=pool, known=tuple(self.pools), action=action)
        return self.pools[pool]

    def as_torch(self, pool: str) -> Any:
        """The pool's array as a CPU `torch.Tensor` sharing its memory (`torch.from_numpy`; bf16 as torch.bfloat16).

        torch is optional: MissingDependency (an ImportError too) names `pip install 'hkv[torch]'` when absent.
        """
        array = self._pool(pool, "as_torch")
        try:
            import torch  # type: ignore[import-not-found, unused-ignore]  # optional: the torch extra
        except ImportError as err:
            raise MissingDependency(package="torch", extra="torch", action="as_torch") from err
        if self.bindings[pool].spec.dtype == "bf16":
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(array)

    # -- read / write ---------------------------------------------------------------------

    def read(self, pool: str, pages: ArrayLike) -> NDArray[Any]:
        """Copies of whole pages: (n, layers, entries_per_page, *entry_shape).  InvalidArgument for a page id
        that is not an integer of the pool (the NULL page included)."""
        array = self._pool(pool, "read")
        ids = _checks.pages("read", pool, pages, array.shape)
        self.tally.entries_read += ids.size * array.shape[2]
        return array[ids].copy()

    def entries(self, pool: str, slots: ArrayLike, layer: int) -> NDArray[Any]:
        """Copies of the entries at flat slots `slots` of layer `layer`: (n, *entry_shape)."""
        array = self._pool(pool, "entries")
        flat, pages, offsets = _checks.slots("entries", pool, slots, array.shape, writing=False)
        layer = _checks.layer("entries", pool, layer, array.shape)
        with self._tally_lock:
            self.tally.entries_read += flat.size
        out: NDArray[Any] = array[pages, layer, offsets]
        return out

    def write(self, pool: str, slots: ArrayLike, values: ArrayLike) -> None:
        """Entry `values[i]` (every layer) into flat slot `slots[i]`; never the NULL page.

        `values` is (n, layers, *entry_shape) of the pool's storage dtype (fp32: float32, fp16: float16, bf16:
        raw bits as uint16); float32 values into a bf16 pool are rounded to bf16 (nearest even).  Any other
        dtype or shape, a slot outside the pool, in the NULL page or given twice is InvalidArgument, and
        nothing is written."""
        array = self._pool(pool, "write")
        flat, pages, offsets = _checks.slots("write", pool, slots, array.shape, writing=True)
        data = _checks.values("write", pool, values, array.shape, flat.size, self.bindings[pool].spec.dtype,
                              array.dtype, np)
        array[pages, :, offsets] = data
        self.tally.entries_written += flat.size

    def export_rows(self, pool: str, runs: Sequence[Run], out: NDArray[Any]) -> None:
        """Entries [first, stop) of each run's page, in order, into `out` (layers, n, *entry_shape)."""
        array, at = self._pool(pool, "export_rows"), 0
        _checks.rows("export_rows", pool, "out", out, array.shape,
                     _checks.runs("export_rows", pool, runs, array.shape, writing=False), array.dtype)
        for page, first, stop in runs:
            np.copyto(out[:, at:at + stop - first], array[page, :, first:stop])
            at += stop - first
        with self._tally_lock:
            self.tally.entries_read += at

    def import_rows(self, pool: str, runs: Sequence[Run], src: NDArray[Any]) -> None:
        """`src` (layers, n, *entry_shape), in order, into entries [first, stop) of each run's page."""
        array, at = self._pool(pool, "import_rows"), 0
        _checks.rows("import_rows", pool, "src", src, array.shape,
                     _checks.runs("import_rows", pool, runs, array.shape, writing=True), array.dtype)
        for page, first, stop in runs:
            np.copyto(array[page, :, first:stop], src[:, at:at + stop - first])
            at += stop - first
        with self._tally_lock:
            self.tally.entries_written += at


def _address(array: NDArray[Any]) -> int:
    return int(array.__array_interface__["data"][0])




_RUNNERS: dict[type, Callable[[RefExecutor, Any, Mapping[str, NDArray[Any]]], Any]] = {
    CopyPages: RefExecutor._copy, FillPages: RefExecutor._fill, Checksum: RefExecutor._checksum,
    StoreRecord: RefExecutor._store, LoadRecord: RefExecutor._load,
}
