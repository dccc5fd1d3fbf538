"""CudaExecutor: the executor protocol over device arrays (CuPy), checked against the NumPy reference.

Every pool is one device array allocated at `bind`, at the alignment its pool
spec asks for, and never reallocated: base addresses are fixed for the
executor's life, so CUDA Graphs captured over them stay valid (F9).  A plan is
checked, verified by the manager at launch (StaleLease, nothing run), and its
ops are queued on the executor's stream; `launch` returns a `PendingPlan`
whose CUDA event says when it is done and whose `wait()` gives the Completion
the engine hands to `CacheManager.complete`.  `run` is launch + wait.

Record ops (StoreRecord / LoadRecord) copy row runs between the pools and the
host buffers the caller names (a tier's bytes); host arrays the executor did
not pin go through one pinned staging buffer.  The host-side
logic runs unchanged on `numpy_backend()`, which CI uses (docs/cuda_executor.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
from numpy.typing import ArrayLike, NDArray

from hkv_core import executor_checks as _checks
from hkv_core.errors import InvalidArgument, MissingDependency, NoDevice, UnknownPool
from hkv_core.executor import (
    PlanAuthority,
    PoolBinding,
    Run,
    adopt_buffers,
    check_op,
    check_pools_fit,
    checked_max_bytes,
    device_estimate,
    record_view,
)
from hkv_core.executor_tally import NUMPY_DTYPES, Tally, pages_moved
from hkv_core.plan import Checksum, Completion, CopyPages, FillPages, LoadRecord, Plan, StoreRecord, page_digest
from hkv_exec_cuda.backend import Backend, Event, cupy_backend
from hkv_exec_cuda.pinned import PinnedArrays

__all__ = ["DEFAULT_STAGING_BYTES", "CudaExecutor", "PendingPlan"]

DEFAULT_STAGING_BYTES = 64 << 20  # one pinned staging buffer; larger host copies go in pieces of this size


@attrs.define
class PendingPlan:
    """A launched plan: `done()` asks its event, `wait()` blocks and returns the Completion (once)."""

    plan_id: int
    event: Event
    finish: Callable[[], Completion]
    keep: list[Any]  # device temporaries and host buffers the queued copies still use
    _completion: Completion | None = None

    def done(self) -> bool:
        return self._completion is not None or self.event.done()

    def wait(self) -> Completion:
        if self._completion is None:
            self.event.synchronize()
            self._completion = self.finish()
            self.keep.clear()
        return self._completion


class CudaExecutor:
    """Executor protocol over `backend.xp` arrays (CuPy on a GPU; NumPy with `numpy_backend()`)."""

    def __init__(self, backend: Backend | None = None, *, staging_bytes: int = DEFAULT_STAGING_BYTES) -> None:
        self.backend: Backend = backend if backend is not None else cupy_backend()
        self.xp: Any = self.backend.xp
        self.pools: dict[str, Any] = {}
        self.bindings: dict[str, PoolBinding] = {}
        self.tally = Tally()
        self.stream = self.backend.stream()
        self.pinned = PinnedArrays(self.backend, staging_bytes)
        self.lock = threading.RLock()  # one launch, read, write, row copy, capture or replay at a time
        self._lock = self.lock
        self._authority: PlanAuthority | None = None
        self._addresses: dict[str, int] = {}

    # -- bind -----------------------------------------------------------------------------

    def bind(self, pools: Sequence[PoolBinding], authority: PlanAuthority, *, max_bytes: int | None = None,
             buffers: Mapping[str, Any] | None = None) -> dict[str, int]:
        """Allocate every pool once (zeroed, base a multiple of its `alignment_bytes`); the base addresses.

        `buffers` ({pool: array}): pools the engine owns - torch CUDA tensors or CuPy arrays on the device (CPU
        tensors and NumPy arrays on the stand-in) - adopted without a copy through DLPack (`xp.from_dlpack`;
        checked by `hkv_core.executor.adopt_buffers`: BufferMismatch naming the pool and the check, alignment
        included) and zeroed on the executor's stream like allocated ones; the executor allocates the rest.
        Before anything is allocated, the pools to allocate, with their alignment padding, are compared with
        `max_bytes` (when given) and the memory the backend says is free (`Backend.free_bytes`: the device's, on
        CuPy): PoolsTooLarge, naming the pools and the bytes needed, when they cannot fit.  Any error leaves the
        executor unbound and the buffers untouched.  A second bind is InvalidExecutorState (pools are static),
        pools that are not PoolBindings with unique names InvalidArgument."""
        _checks.check_bind("bind", self.pools, pools)
        limit = checked_max_bytes("bind", max_bytes)
        adopted = adopt_buffers(pools, buffers, from_dlpack=self.xp.from_dlpack, address=self.backend.address,
                                dtype_of=lambda b: np.dtype(NUMPY_DTYPES[b.spec.dtype]))
        check_pools_fit(device_estimate([b for b in pools if b.name not in adopted], padding=True),
                        [(limit, "max_bytes"), (self.backend.free_bytes(), self.backend.memory_name)])
        with self.stream:  # zeroed on the executor's own stream, done before any plan runs on it
            for binding in pools:
                if binding.name in adopted:
                    adopted[binding.name][...] = 0
                    self.pools[binding.name] = adopted[binding.name]
                else:
                    dtype = np.dtype(NUMPY_DTYPES[binding.spec.dtype])
                    nbytes = int(np.prod(binding.shape, dtype=np.int64)) * dtype.itemsize
                    raw = self.backend.empty_aligned(nbytes, binding.spec.alignment_bytes)
                    raw[...] = 0
                    self.pools[binding.name] = raw.view(dtype).reshape(binding.shape)
                self.bindings[binding.name] = binding
                base = self.backend.address(self.pools[binding.name])
                assert base % binding.spec.alignment_bytes == 0, (binding.name, base)
            self.stream.synchronize()
        self._authority = authority
        self._addresses = self.addresses()
        return dict(self._addresses)

    def addresses(self) -> dict[str, int]:
        """Base address of every pool's buffer right now (equal to what `bind` returned)."""
        return {name: self.backend.address(array) for name, array in self.pools.items()}

    # -- plans ----------------------------------------------------------------------------

    def launch(self, plan: Plan, records: Mapping[str, NDArray[Any]] | None = None) -> PendingPlan:
        """Check the plan, have the authority verify it (StaleLease: nothing queued), queue its ops (record ops
        copy between the device and `records`, the host buffers by name, before this returns).

        InvalidExecutorState before `bind`; UnknownPool / InvalidArgument for a malformed op (nothing queued)."""
        _checks.check_bound("launch", self._authority)
        if not isinstance(plan, Plan):
            raise InvalidArgument(action="launch", argument="plan", value=plan,
                                  reason=f"must be a hkv_core.plan.Plan, got {type(plan).__name__}")
        assert self._authority is not None
        with self._lock:
            buffers = records or {}
            shapes = {name: tuple(array.shape) for name, array in self.pools.items()}
            itemsizes = {name: int(array.dtype.itemsize) for name, array in self.pools.items()}
            for op in plan.ops:
                check_op(op, shapes, buffers, itemsizes)
            self._authority.verify(plan)
            keep: list[Any] = []
            sums: list[NDArray[Any]] = []
            with self.stream:
                for op in plan.ops:
                    if isinstance(op, StoreRecord | LoadRecord):
                        self._record(op, buffers)
                        continue
                    out = _RUNNERS[type(op)](self, op, keep)
                    if isinstance(op, Checksum):
                        sums.append(out)
            event = self.backend.record(self.stream)
            moved = sum(pages_moved(op) for op in plan.ops)
            copied = sum(op.entries for op in plan.ops if isinstance(op, CopyPages))
            self.tally.plans += 1
            self.tally.ops += len(plan.ops)
            self.tally.pages_moved += moved
            self.tally.entries_copied += copied
        assert self._addresses == self.addresses(), "a pool moved: pools are static"

        def finish() -> Completion:
            digests = tuple(tuple(page_digest(page.tobytes()) for page in pages) for pages in sums)
            for pages in sums:
                self.pinned.release(pages)
            return Completion(digests=digests, ops_run=len(plan.ops), pages_moved=moved, entries_copied=copied)

        return PendingPlan(plan_id=plan.plan_id, event=event, finish=finish, keep=keep)

    def run(self, plan: Plan, records: Mapping[str, NDArray[Any]] | None = None) -> Completion:
        """Launch the plan and wait for it: the Completion to hand to `CacheManager.complete`."""
        return self.launch(plan, records).wait()

    def _index(self, pages: Sequence[int] | NDArray[Any]) -> Any:
        return self.xp.asarray(np.asarray(pages, np.int64))

    def _copy(self, op: CopyPages, keep: list[Any]) -> None:
        pool = self.pools[op.pool]
        pool[op.dst, :, : op.entries] = pool[op.src, :, : op.entries]

    def _fill(self, op: FillPages, keep: list[Any]) -> None:
        pool = self.pools[op.pool]
        pool.view(self.xp.uint8)[self._index(op.pages)] = op.value

    def _to_pinned(self, pool: str, pages: Sequence[int], keep: list[Any]) -> NDArray[Any]:
        """Queue a copy of whole pages into a new pinned host array; the array (filled once the event fires)."""
        gathered = self.pools[pool][self._index(pages)]
        host = self.pinned.empty(tuple(gathered.shape), gathered.dtype)
        self.backend.to_host(gathered, host, self.stream)
        keep.append(gathered)
        return host

    def _checksum(self, op: Checksum, keep: list[Any]) -> NDArray[Any]:
        return self._to_pinned(op.pool, op.pages, keep)

    def _record(self, op: StoreRecord | LoadRecord, records: Mapping[str, NDArray[Any]]) -> None:
        """A record op: its rows between the pool and the host buffer, through the row-run copies (in stream
        order: they synchronize the executor's stream)."""
        array = self.pools[op.pool]
        view = record_view(op, tuple(array.shape), np.dtype(array.dtype), records[op.record])
        (self.export_rows if isinstance(op, StoreRecord) else self.import_rows)(op.pool, op.runs, view)

    # -- zero-copy views ------------------------------------------------------------------

    def _pool(self, pool: str, action: str) -> Any:
        """The pool's device array; UnknownPool (listing the bound pools; none before `bind`) for any other name."""
        if not isinstance(pool, str) or pool not in self.pools:
            raise UnknownPool(pool=pool, known=tuple(self.pools), action=action)
        return self.pools[pool]

    def as_array(self, pool: str) -> Any:
        """The pool's own device array (a CuPy array; a NumPy array on the stand-in): no copy, writable.

        Shape `PoolBinding.shape`; a bf16 pool is its raw bits as uint16; page 0 (NULL) must stay untouched."""
        return self._pool(pool, "as_array")

    def as_cupy(self, pool: str) -> Any:
        """The pool's own CuPy array (zero-copy); NoDevice when this executor runs on the NumPy stand-in."""
        array = self._pool(pool, "as_cupy")
        if self.backend.name != "cupy":
            raise NoDevice(reason=f"as_cupy({pool!r}): this executor runs on the {self.backend.name} stand-in")
        return array

    def as_torch(self, pool: str) -> Any:
        """The pool as a `torch.Tensor` sharing its memory through DLPack (a CUDA tensor on the GPU, a CPU tensor
        on the stand-in; bf16 pools as torch.bfloat16).  MissingDependency names the torch extra when absent."""
        array = self._pool(pool, "as_torch")
        try:
            import torch  # type: ignore[import-not-found, unused-ignore]  # optional: the torch extra
        except ImportError as err:
            raise MissingDependency(package="torch", extra="torch", action="as_torch") from err
        from_dlpack = torch.utils.dlpack.from_dlpack
        if self.bindings[pool].spec.dtype == "bf16":
            return from_dlpack(array.view(self.xp.int16)).view(torch.bfloat16)
        return from_dlpack(array)

    # -- read / write ---------------------------------------------------------------------

    def read(self, pool: str, pages: ArrayLike) -> NDArray[Any]:
        """Host copies of whole pages: (n, layers, entries_per_page, *entry_shape)."""
        array = self._pool(pool, "read")
        ids = _checks.pages("read", pool, pages, tuple(array.shape))
        with self._lock, self.stream:
            gathered = array[self._index(ids)]
            out = np.empty(gathered.shape, gathered.dtype)
            self.backend.to_host(gathered, out, self.stream)
            self.stream.synchronize()
            self.tally.entries_read += ids.size * array.shape[2]
        return out

    def entries(self, pool: str, slots: ArrayLike, layer: int) -> Any:
        """Device copies of the entries at flat slots `slots` of layer `layer`: (n, *entry_shape)."""
        array = self._pool(pool, "entries")
        flat, pages, offsets = _checks.slots("entries", pool, slots, tuple(array.shape), writing=False)
        layer = _checks.layer("entries", pool, layer, tuple(array.shape))
        current = self.backend.current_stream()  # the model's: the copies are made and used there
        with self._lock:
            self.backend.wait(current, self.stream)  # plans queued before land first
            out = array[self._index(pages), layer, self._index(offsets)]
            self.backend.wait(self.stream, current)  # plans queued after wait for this read
            self.tally.entries_read += flat.size
        return out

    def write(self, pool: str, slots: ArrayLike, values: Any) -> None:
        """Entry `values[i]` (every layer) into flat slot `slots[i]`; never the NULL page.  `values` is a host
        array or a device array (the model's output on the GPU), of the pool's storage dtype (bf16: raw bits as
        uint16; float32 values into a bf16 pool are rounded to bf16).  InvalidArgument, nothing written, for any
        other dtype or shape and for a slot outside the pool, in the NULL page or given twice (as RefExecutor)."""
        array = self._pool(pool, "write")
        flat, pages, offsets = _checks.slots("write", pool, slots, tuple(array.shape), writing=True)
        values = _checks.values("write", pool, values, tuple(array.shape), flat.size,
                                self.bindings[pool].spec.dtype, np.dtype(array.dtype), self.xp)
        current = self.backend.current_stream()  # where the model computed `values`
        with self._lock:
            self.backend.wait(current, self.stream)  # plans queued before land first
            data = self.xp.asarray(values)
            array[self._index(pages), :, self._index(offsets)] = data
            self.backend.wait(self.stream, current)  # plans queued after see the entries
            self.tally.entries_written += flat.size

    # -- row runs (tiers) -----------------------------------------------------------------

    def _run_index(self, array: Any, runs: Sequence[Run], *, writing: bool) -> tuple[Any, Any, int]:
        """Device index arrays (page of each entry, entry in its page) of `runs`, and their count."""
        none = [np.zeros(0, np.int64)]
        pages = np.concatenate([np.full(stop - first, page, np.int64) for page, first, stop in runs] or none)
        entries = np.concatenate([np.arange(first, stop, dtype=np.int64) for _, first, stop in runs] or none)
        return self._index(pages.astype(np.int64)), self._index(entries.astype(np.int64)), int(pages.size)

    def export_rows(self, pool: str, runs: Sequence[Run], out: NDArray[Any]) -> None:
        """Entries [first, stop) of each run's page, in order, into host `out` (layers, n, *entry_shape)."""
        array = self._pool(pool, "export_rows")
        with self._lock, self.stream:
            _checks.rows("export_rows", pool, "out", out, tuple(array.shape),
                         _checks.runs("export_rows", pool, runs, tuple(array.shape), writing=False),
                         np.dtype(array.dtype))
            pages, entries, n = self._run_index(array, runs, writing=False)
            rows = self.xp.ascontiguousarray(array[pages, :, entries].swapaxes(0, 1))
            self._host_copy(rows, out, to_device=False)
            self.tally.entries_read += n

    def import_rows(self, pool: str, runs: Sequence[Run], src: NDArray[Any]) -> None:
        """Host `src` (layers, n, *entry_shape), in order, into entries [first, stop) of each run's page."""
        array = self._pool(pool, "import_rows")
        with self._lock, self.stream:
            _checks.rows("import_rows", pool, "src", src, tuple(array.shape),
                         _checks.runs("import_rows", pool, runs, tuple(array.shape), writing=True),
                         np.dtype(array.dtype))
            pages, entries, n = self._run_index(array, runs, writing=True)
            rows = self.xp.empty(src.shape, array.dtype)
            self._host_copy(rows, src, to_device=True)
            array[pages, :, entries] = rows.swapaxes(0, 1)
            self.stream.synchronize()
            self.tally.entries_written += n

    def _host_copy(self, device: Any, host: NDArray[Any], *, to_device: bool) -> None:
        """Copy between a contiguous device array and a host array of one shape: directly when `host` is pinned
        by this executor, else through the staging buffer in pieces along axis 1; returns once the copy is done."""
        if self.pinned.holds(host):
            (self.backend.to_device(host, device, self.stream) if to_device
             else self.backend.to_host(device, host, self.stream))
            self.stream.synchronize()
            return
        with self.pinned.staging_lock:
            for piece in _pieces(host.shape, host.itemsize, self.pinned.staging.size):
                shape = (*(len(range(*sl.indices(n))) for sl, n in zip(piece, host.shape, strict=False)),
                         *host.shape[2:])
                stage = self.pinned.staging_view(int(np.prod(shape)) * host.itemsize, host.dtype, shape)
                if to_device:
                    np.copyto(stage, host[piece])
                    part = self.xp.empty(stage.shape, device.dtype)
                    self.backend.to_device(stage, part, self.stream)
                    device[piece] = part
                    self.stream.synchronize()
                else:
                    self.backend.to_host(self.xp.ascontiguousarray(device[piece]), stage, self.stream)
                    self.stream.synchronize()
                    np.copyto(host[piece], stage)


def _pieces(shape: tuple[int, ...], itemsize: int, limit: int) -> list[tuple[slice, slice]]:
    """(layers, columns) slices of an array shaped (layers, n, *entry) whose pieces fit `limit` bytes: whole
    layers when a layer fits, else column runs of one layer (an entry of one layer must fit)."""
    layers, n = shape[0], shape[1]
    entry = int(np.prod(shape[2:], dtype=np.int64)) * itemsize
    if entry > limit:
        raise InvalidArgument(action="row copy", argument="staging_bytes", value=limit,
                              reason=f"one entry of {entry} bytes exceeds the {limit}-byte staging buffer: build the "
                                     f"executor with staging_bytes >= {entry}")
    if n * entry <= limit:
        step = max(1, limit // max(1, n * entry))
        return [(slice(lo, min(layers, lo + step)), slice(0, n)) for lo in range(0, layers, step)]
    step = limit // entry
    return [(slice(layer, layer + 1), slice(lo, min(n, lo + step))) for layer in range(layers)
            for lo in range(0, n, step)]


_RUNNERS: dict[type, Callable[[CudaExecutor, Any, list[Any]], Any]] = {
    CopyPages: CudaExecutor._copy, FillPages: CudaExecutor._fill, Checksum: CudaExecutor._checksum,
}
