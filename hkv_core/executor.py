"""The narrow executor interface (docs/executor.md).

An executor owns the bytes; the manager owns the metadata.  The two meet
only through plans (hkv_core.plan) and this protocol, which sits beside the
manager: it depends on layout, plan and errors, never on the manager.

- `bind(pools, authority) -> addresses`: allocate every pool once (static
  pools: base addresses never change, so captured CUDA Graphs stay valid, F9)
  and keep `authority`, whatever issued the plans (the CacheManager).
- `run(plan, records=None) -> Completion`: at launch, `authority.verify(plan)` checks every
  op's page versions against the authority's live state under its lock
  (StaleLease and nothing run if any moved); then carry the ops out (later,
  on a stream or a disk worker, is fine: the manager keeps the pages of an
  issued plan pinned until `complete`).  The caller hands the completion back
  with `CacheManager.complete(plan.plan_id, completion)`.  `records` maps the
  record names of the plan's StoreRecord / LoadRecord ops to their host
  buffers (uint8 arrays; writable for a store): the one path between the
  pools and the tiers (docs/tiers.md).
- `read(pool, pages)`: host copies of whole pages, shape
  `(n, layers, entries_per_page, *entry_shape)`.
- `entries(pool, slots, layer)`: copies of the entries at flat slots of one layer,
  `(n, *entry_shape)`, as arrays of the executor's array module `xp` (NumPy for the
  reference, CuPy on a GPU): how a model reads its resume state without leaving the device.
- `write(pool, slots, values)`: one entry per flat slot
  `page * entries_per_page + offset`, values shaped `(n, layers, *entry_shape)`
  (host arrays, or arrays of `xp`).

Sizing: `PoolBinding.nbytes` is what one pool takes, `device_estimate(bindings)` adds
every pool up (`hkv_core.manager.estimate_device_bytes(layout, config)` does so from a
config, before any manager exists), and `check_pools_fit` is how an executor's `bind`
refuses pools that cannot fit (`PoolsTooLarge`, before any pool is allocated).

A pool's array has shape `PoolBinding.shape`:
`(pages, layers, entries_per_page, *entry_shape)`, page 0 being the NULL page
(never written by `write`, copies or loads).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol

import attrs
import numpy as np
from numpy.typing import ArrayLike, NDArray

from hkv_core.errors import BufferMismatch, InvalidArgument, PoolsTooLarge, UnknownPool
from hkv_core.layout import PoolSpec
from hkv_core.plan import Completion, CopyPages, FillPages, LoadRecord, Op, Plan, StoreRecord
from hkv_core.units import NULL_PAGE

__all__ = ["DeviceEstimate", "Executor", "PlanAuthority", "PoolBinding", "Run", "TrustingAuthority",
           "adopt_buffers", "available_host_bytes", "check_op", "check_pools_fit", "checked_max_bytes",
           "device_estimate", "record_bytes", "record_view"]

Run = tuple[int, int, int]  # (page, first entry, stop entry): one contiguous piece of a page


@attrs.frozen(kw_only=True)
class PoolBinding:
    """One pool to allocate: its spec and page count (the NULL page included)."""

    spec: PoolSpec
    pages: int

    def __attrs_post_init__(self) -> None:
        assert self.pages >= 2, f"{self.spec.name}: the NULL page and at least one real page"

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def shape(self) -> tuple[int, ...]:
        """(pages, layers, entries_per_page, *entry_shape)."""
        s = self.spec
        return (self.pages, s.layer_count, s.entries_per_page, *s.entry_shape)

    @property
    def page_bytes(self) -> int:
        """Bytes of one page across every layer of the pool (`PoolSpec.page_bytes` is one layer's)."""
        return self.spec.page_bytes * self.spec.layer_count

    @property
    def nbytes(self) -> int:
        """Bytes of the whole pool, the NULL page included: what `bind` allocates for it."""
        return self.pages * self.page_bytes


@attrs.frozen(kw_only=True)
class DeviceEstimate:
    """The memory an executor's pools take: bytes and pages per pool (NULL page included), in binding order.

    `roles` names each pool's role (prefix, window, tail) when the estimate comes from a layout and config
    (`hkv_core.manager.estimate_device_bytes`); empty from bare bindings.
    """

    pools: Mapping[str, int]
    pages: Mapping[str, int]
    roles: Mapping[str, str] = attrs.field(factory=lambda: MappingProxyType({}))

    @property
    def total(self) -> int:
        return sum(self.pools.values())

    @property
    def largest(self) -> tuple[tuple[str, int], ...]:
        """Every pool as (name, bytes), the largest first."""
        return tuple(sorted(self.pools.items(), key=lambda item: (-item[1], item[0])))

    def by_role(self) -> dict[str, int]:
        """Bytes per role (empty without `roles`)."""
        out: dict[str, int] = {}
        for name, role in self.roles.items():
            out[role] = out.get(role, 0) + self.pools[name]
        return out


def device_estimate(pools: Sequence[PoolBinding], *, padding: bool = False,
                    roles: Mapping[str, str] | None = None) -> DeviceEstimate:
    """What `bind(pools, ...)` allocates, per pool, without allocating it.  `padding`: add each pool's
    `alignment_bytes`, which an executor that over-allocates to align a base (CudaExecutor) spends on top."""
    sizes = {b.name: b.nbytes + (b.spec.alignment_bytes if padding else 0) for b in pools}
    return DeviceEstimate(pools=MappingProxyType(sizes), pages=MappingProxyType({b.name: b.pages for b in pools}),
                          roles=MappingProxyType(dict(roles or {})))


def available_host_bytes() -> int | None:
    """Host memory a new allocation can take now: MemAvailable of /proc/meminfo, else the free pages
    (`os.sysconf`); None where neither is known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages if pages > 0 else None


def checked_max_bytes(action: str, max_bytes: object) -> int | None:
    """`max_bytes` of a `bind`: None or an integer >= 0 (InvalidArgument otherwise)."""
    if max_bytes is None:
        return None
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise InvalidArgument(action=action, argument="max_bytes", value=max_bytes,
                              reason="must be None or an integer >= 0 (bytes the pools may take)")
    return max_bytes


def adopt_buffers(pools: Sequence[PoolBinding], buffers: object, *, from_dlpack: Callable[[Any], Any],
                  address: Callable[[Any], int], dtype_of: Callable[[PoolBinding], Any]) -> dict[str, Any]:
    """Engine-owned buffers for some of `pools`, adopted without a copy and checked before anything is bound.

    `buffers` maps pool names to arrays that export DLPack (torch tensors, CuPy or NumPy arrays); each is
    taken with `from_dlpack` (the executor's array module: the memory stays the engine's) and must be
    C-contiguous, writable, of shape `PoolBinding.shape` and of the pool's dtype (`dtype_of`; a bf16 pool takes
    its raw bits as a 2-byte integer array: pass `tensor.view(torch.int16)`), with a base address (`address`)
    that is a multiple of the pool's `alignment_bytes`, and no two may overlap.  InvalidArgument when
    `buffers` is not a mapping, UnknownPool for a name `pools` lacks, BufferMismatch (pool, check, expected,
    found) for the first buffer that fails a check.  Returns {pool: adopted array in `dtype_of(binding)`}."""
    if buffers is None:
        return {}
    if not isinstance(buffers, Mapping):
        raise InvalidArgument(action="bind", argument="buffers", value=buffers,
                              reason=f"must be None or a mapping of pool name to array, got {type(buffers).__name__}")
    by_name = {b.name: b for b in pools}
    adopted: dict[str, Any] = {}
    spans: list[tuple[int, int, str]] = []
    for name, buffer in buffers.items():
        if not isinstance(name, str) or name not in by_name:
            raise UnknownPool(pool=name, known=tuple(by_name), action="bind")
        binding = by_name[name]
        try:
            array = from_dlpack(buffer)
        except (TypeError, ValueError, BufferError, RuntimeError, AttributeError) as err:
            bf16 = "bfloat16" in str(getattr(buffer, "dtype", ""))
            hint = " (a bfloat16 tensor: pass tensor.view(torch.int16))" if bf16 else ""
            raise BufferMismatch(pool=name, check="dlpack", expected=f"an array exporting DLPack on this executor's "
                                 f"device{hint}", found=f"{type(buffer).__name__}: {err}") from None
        want = dtype_of(binding)
        found_dtype = getattr(array, "dtype", None)
        if binding.spec.dtype == "bf16" and found_dtype is not None and found_dtype.itemsize == 2 and \
                found_dtype.kind in "iu":
            array = array.view(want)  # bf16 bits: uint16 here, int16 from torch
            found_dtype = array.dtype
        if tuple(array.shape) != binding.shape:
            raise BufferMismatch(pool=name, check="shape", expected=binding.shape, found=tuple(array.shape))
        if found_dtype != want:
            raise BufferMismatch(pool=name, check="dtype", expected=f"{want} ({binding.spec.dtype})",
                                 found=found_dtype)
        if not array.flags.c_contiguous:
            raise BufferMismatch(pool=name, check="contiguous", expected="C-contiguous", found="strided")
        if not getattr(array.flags, "writeable", True):
            raise BufferMismatch(pool=name, check="writable", expected="writable", found="read-only")
        base = address(array)
        if base % binding.spec.alignment_bytes:
            raise BufferMismatch(pool=name, check="alignment",
                                 expected=f"a base address that is a multiple of {binding.spec.alignment_bytes}",
                                 found=f"{base:#x}")
        spans.append((base, base + binding.nbytes, name))
        adopted[name] = array
    spans.sort()
    for (_, end, first), (start, _, second) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise BufferMismatch(pool=second, check="overlap", expected="memory of its own",
                                 found=f"memory shared with pool {first!r}")
    return adopted


def check_pools_fit(estimate: DeviceEstimate, limits: Sequence[tuple[int | None, str]]) -> None:
    """PoolsTooLarge naming every pool and the bytes needed when `estimate.total` is past any known limit of
    `limits`, (bytes or None, what they are: "max_bytes", "host memory available"); the smallest known one
    is compared against.  Nothing is allocated: an executor calls this first in `bind`."""
    known = [(limit, memory) for limit, memory in limits if limit is not None]
    if not known:
        return
    available, memory = min(known, key=lambda item: item[0])
    if estimate.total > available:
        raise PoolsTooLarge(needed_bytes=estimate.total, available_bytes=available, memory=memory,
                            pools=estimate.largest)


class PlanAuthority(Protocol):
    """Whoever issued a plan (the CacheManager): checks its versions at launch, under its own lock."""

    def verify(self, plan: Plan) -> None:
        """StaleLease for the first page of `plan` whose version or state moved since it was planned."""
        ...


class TrustingAuthority:
    """An authority for plans with nothing to check against (standalone executor tests): verifies nothing."""

    def verify(self, plan: Plan) -> None:
        return None


class Executor(Protocol):
    """What the manager and an engine need from a backend (NumPy, CUDA)."""

    def bind(self, pools: Sequence[PoolBinding], authority: PlanAuthority) -> dict[str, int]:
        """Allocate every pool once; return each pool's base address (stable for the executor's life)."""
        ...

    def run(self, plan: Plan, records: Mapping[str, NDArray[Any]] | None = None) -> Completion:
        """Verify the plan through the authority (StaleLease, nothing run), then run the ops in order; `records`:
        the host buffers of its record ops, by record name."""
        ...

    xp: Any  # the array module of the pools and of what `entries` returns (numpy, cupy)

    def read(self, pool: str, pages: ArrayLike) -> NDArray[Any]:
        """Host copies of whole pages: (n, layers, entries_per_page, *entry_shape)."""
        ...

    def entries(self, pool: str, slots: ArrayLike, layer: int) -> Any:
        """Copies of the entries at flat slots `page * entries_per_page + offset` of one layer: (n, *entry_shape),
        an array of `xp`."""
        ...

    def write(self, pool: str, slots: ArrayLike, values: ArrayLike) -> None:
        """Write one entry (every layer) per flat slot; values (n, layers, *entry_shape)."""
        ...


def check_op(op: Op, shapes: dict[str, tuple[int, ...]], records: Mapping[str, NDArray[Any]] | None = None,
             itemsizes: Mapping[str, int] | None = None) -> None:
    """Check that `op` is well formed for pools of `shapes` (and, for a record op, `records`, the host buffers by
    name, and `itemsizes`, each pool's bytes per element).  Every executor checks a whole plan this way before
    running any of it: UnknownPool for a pool it does not have, InvalidArgument (argument `plan`) for a page
    outside the pool, a copy into the NULL page or onto its source, an entry count outside the page, a run
    outside its page, a record op whose buffer is missing, too short, read-only for a store, or not bytes."""
    if op.pool not in shapes:
        raise UnknownPool(pool=op.pool, known=tuple(shapes), action="run")
    shape = shapes[op.pool]
    pages, entries = shape[0], shape[2]
    touched = (op.src, op.dst) if isinstance(op, CopyPages) else op.pages
    reason = ""
    if not all(0 <= p < pages for p in touched):
        reason = f"a page outside [0, {pages})"
    elif isinstance(op, CopyPages) and (op.dst == NULL_PAGE or op.src == op.dst):
        reason = "a copy into the NULL page or onto its own source"
    elif isinstance(op, CopyPages) and not 0 <= op.entries <= entries:
        reason = f"an entry count outside [0, {entries}]"
    elif isinstance(op, LoadRecord) and NULL_PAGE in op.pages:
        reason = "a load into the NULL page"
    elif isinstance(op, FillPages) and not 0 <= op.value <= 255:
        reason = f"a fill byte {op.value} outside 0..255"
    elif isinstance(op, StoreRecord | LoadRecord):
        reason = _record_problem(op, shape, records or {}, (itemsizes or {}).get(op.pool, 0))
    if reason:
        raise InvalidArgument(action="run", argument="plan", value=op, reason=f"{op.pool}: {reason}")


def record_bytes(op: StoreRecord | LoadRecord, shape: tuple[int, ...], itemsize: int) -> int:
    """Bytes of the record's piece `op` reads or writes within: (first_row + rows) rows of every layer."""
    per_row = shape[1] * itemsize
    for n in shape[3:]:
        per_row *= n
    return (op.first_row + op.rows) * per_row


def record_view(op: StoreRecord | LoadRecord, shape: tuple[int, ...], dtype: Any,
                buffer: NDArray[np.uint8]) -> NDArray[Any]:
    """The (layers, rows, *entry_shape) view of `buffer` an op (checked by `check_op`) moves rows to or from."""
    nbytes = record_bytes(op, shape, np.dtype(dtype).itemsize)
    piece = buffer[op.offset:op.offset + nbytes].view(dtype).reshape(shape[1], op.first_row + op.rows, *shape[3:])
    view: NDArray[Any] = piece[:, op.first_row:]
    return view


def _record_problem(op: StoreRecord | LoadRecord, shape: tuple[int, ...], records: Mapping[str, NDArray[Any]],
                    itemsize: int) -> str:
    if any(stop > shape[2] for _, _, stop in op.runs):
        return f"a run past the page's {shape[2]} entries"
    buffer = records.get(op.record)
    if buffer is None:
        return f"no host buffer for record {op.record!r} (run(plan, records={{name: buffer}}))"
    if getattr(buffer, "dtype", None) != np.uint8 or getattr(buffer, "ndim", 0) != 1:
        return f"record {op.record!r}: its buffer must be a 1-d uint8 array"
    if isinstance(op, StoreRecord) and not buffer.flags.writeable:
        return f"record {op.record!r}: a store needs a writable buffer"
    need = op.offset + record_bytes(op, shape, itemsize)
    if need > buffer.size:
        return f"record {op.record!r}: bytes [{op.offset}, {need}) past its {buffer.size}-byte buffer"
    return ""
