"""One exception hierarchy for every operating error hkv raises.

Every error carries structured fields (``err.fields``) as well as a readable
message, so engines can log, count and branch on them without parsing text.
Internal consistency checks are ``assert`` statements; anything a caller can
get wrong (an argument, a call out of order) is an ``HkvError``, which
``python -O`` does not strip.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AdmissionRejected", "BufferMismatch", "CacheBusy", "ConfigError", "GraphAddressChanged", "HkvError",
           "IllegalTransition", "InvalidArgument", "InvalidExecutorState", "InvalidRequestArgument",
           "InvalidRequestState", "InvalidTokens", "InvariantViolation", "MetadataTooLarge", "MissingDependency",
           "NoDevice", "OutOfPages", "PoolsTooLarge", "RecordCorrupt", "SpecError", "StaleLease", "TierError",
           "TierFull", "UnitError", "UnknownPlan", "UnknownPool", "UnknownRequest", "shown"]

SHOWN_CHARS = 80  # an argument's value is shown in a message up to this many characters of its repr


def shown(value: object) -> str:
    """`repr(value)`, cut to SHOWN_CHARS characters (a message never prints a whole prompt)."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS - 3]}..."


class HkvError(Exception):
    """Base class: ``fields`` holds the structured details named in the message."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields: dict[str, Any] = fields


class SpecError(HkvError):
    """A spec file (lifecycle, validation, preset) is malformed.

    ``file``, ``table`` and ``key`` locate the offending entry; ``kind`` names
    the object kind whose table it is in (None outside a kind's table).
    """

    def __init__(self, message: str, *, file: str, table: str, key: str, kind: str | None = None) -> None:
        where = f"kind {kind!r}, " if kind is not None else ""
        at = f" [{table}] {where}{key}" if table or key != "*" else ""  # a fault of the whole file: the file only
        super().__init__(f"{file}{at}: {message}", file=file, table=table, key=key, kind=kind)
        self.file, self.table, self.key, self.kind = file, table, key, kind


class ConfigError(HkvError):
    """A configuration is unusable: a model config (Hugging Face style dict or preset), a ManagerConfig.

    ``source`` names the configuration, ``key`` the field; ``reason`` is what
    is wrong with it (the message without the two).
    """

    def __init__(self, message: str, *, source: str, key: str) -> None:
        super().__init__(f"{source}: {key}: {message}", source=source, key=key)
        self.source, self.key, self.reason = source, key, message


class MetadataTooLarge(ConfigError):
    """A manager's tables would take more memory than `ManagerConfig.max_metadata_bytes` allows.

    Raised at construction, before any table is allocated.  ``needed_bytes``
    is the estimate (`hkv_core.manager.estimate_metadata`), ``limit_bytes``
    the limit, ``largest`` the table that takes the most.
    """

    def __init__(self, *, needed_bytes: int, limit_bytes: int, largest: str, largest_bytes: int) -> None:
        super().__init__(f"the manager's tables need {needed_bytes:,} bytes, more than the limit of {limit_bytes:,} "
                         f"(the largest: {largest}, {largest_bytes:,} bytes); use smaller pools or caps, "
                         f"or raise max_metadata_bytes", source="ManagerConfig", key="max_metadata_bytes")
        self.needed_bytes, self.limit_bytes = needed_bytes, limit_bytes
        self.largest, self.largest_bytes = largest, largest_bytes
        self.fields.update(needed_bytes=needed_bytes, limit_bytes=limit_bytes, largest=largest,
                           largest_bytes=largest_bytes)


class PoolsTooLarge(ConfigError):
    """An executor's pools would take more memory than there is: refused by `bind` before any pool is allocated.

    ``needed_bytes`` is what every pool together takes (`hkv_core.executor.device_estimate`), ``available_bytes``
    what ``memory`` (the limit compared against: a ``max_bytes`` argument, the host's available memory, the
    device's free memory) offers; ``pools`` lists every pool as (name, bytes), the largest first.
    """

    def __init__(self, *, needed_bytes: int, available_bytes: int, memory: str,
                 pools: tuple[tuple[str, int], ...]) -> None:
        largest = ", ".join(f"{name} {size:,}" for name, size in pools[:3])
        super().__init__(f"the pools need {needed_bytes:,} bytes, more than the {available_bytes:,} bytes of {memory} "
                         f"(largest: {largest}); give the big pools fewer pages (ManagerConfig.pool_pages: tail "
                         f"pools need far fewer than window or KV pools; docs/executor.md, sizing)",
                         source="ManagerConfig", key="pool_pages")
        self.needed_bytes, self.available_bytes, self.memory, self.pools = needed_bytes, available_bytes, memory, pools
        self.fields.update(needed_bytes=needed_bytes, available_bytes=available_bytes, memory=memory, pools=pools)


class BufferMismatch(HkvError, ValueError):
    """A buffer an engine hands to an executor's `bind` (`buffers={pool: array}`) cannot be that pool.

    ``pool`` names the pool, ``check`` what failed (dlpack, shape, dtype, contiguous, writable, alignment,
    overlap), ``expected`` and ``found`` the two sides.  Nothing is bound when it is raised.
    """

    def __init__(self, *, pool: str, check: str, expected: object, found: object) -> None:
        super().__init__(f"bind: the buffer for pool {pool!r} fails the {check} check: expected {expected}, found "
                         f"{found}", pool=pool, check=check, expected=expected, found=found)
        self.pool, self.check, self.expected, self.found = pool, check, expected, found


class IllegalTransition(HkvError):
    """The lifecycle spec has no transition for (kind, state, event), or a guard refused it."""

    def __init__(self, *, kind: str, state: str, event: str, guard: str | None = None) -> None:
        why = f"guard {guard!r} refused" if guard else "no such transition in the spec"
        super().__init__(
            f"illegal transition: kind={kind} state={state} event={event} ({why})",
            kind=kind,
            state=state,
            event=event,
            guard=guard,
        )
        self.kind, self.state, self.event, self.guard = kind, state, event, guard


class UnitError(HkvError):
    """A size or position given in the wrong unit or out of range (tokens, entries, pages)."""

    def __init__(self, message: str, *, name: str, value: int) -> None:
        super().__init__(f"{name}={value}: {message}", name=name, value=value)
        self.name, self.value = name, value


class InvalidTokens(HkvError):
    """A token array is not a 1-D integer array of token ids in ``[0, 2**31)``.

    ``reason`` says what is wrong; ``dtype`` and ``shape`` describe what was
    given (``None`` when it was not a NumPy array at all).
    """

    def __init__(self, reason: str, *, dtype: str | None, shape: tuple[int, ...] | None) -> None:
        super().__init__(f"invalid tokens (dtype={dtype}, shape={shape}): {reason}",
                         reason=reason, dtype=dtype, shape=shape)
        self.reason, self.dtype, self.shape = reason, dtype, shape


class StaleLease(HkvError):
    """A hit, lease or plan whose checked objects moved: a new version, or out of the state it was checked in (F3).

    `pool` names the pool (or the index kind, `block` / `resume_point`) and
    `page` the page (block, point) that moved; `found_state` is its state now
    and `expected_state` the one the hit or plan relied on (a window page can
    leave PUBLISHED, retired from the index while another request still pins
    it, without its version moving).
    """

    def __init__(self, *, pool: str, page: int, expected_version: int, found_version: int,
                 request_id: int, expected_state: str = "PUBLISHED", found_state: str = "PUBLISHED") -> None:
        moved = f"version {found_version}, the hit checked {expected_version}"
        if found_state != expected_state:
            moved += f"; state {found_state}, the hit needs {expected_state}"
        super().__init__(
            f"stale lease for request {request_id}: {pool} page {page} {moved}",
            pool=pool, page=page, expected_version=expected_version, found_version=found_version,
            request_id=request_id, expected_state=expected_state, found_state=found_state)
        self.pool, self.page, self.request_id = pool, page, request_id
        self.expected_version, self.found_version = expected_version, found_version
        self.expected_state, self.found_state = expected_state, found_state


class AdmissionRejected(HkvError):
    """A request would exceed an admission cap (requests in flight, tokens per request, pages of a pool)."""

    def __init__(self, *, cap: str, limit: int, needed: int, detail: str = "") -> None:
        super().__init__(f"admission rejected: {cap} needs {needed}, limit {limit}. {detail}".strip(),
                         cap=cap, limit=limit, needed=needed)
        self.cap, self.limit, self.needed = cap, limit, needed


class OutOfPages(AdmissionRejected):
    """A pool (or an index table) cannot supply what an allocation needs, even after eviction; nothing changed.

    ``free``: pages (rows) free now; ``evictable``: how many more eviction
    could free; ``held``: the rest of the pool, which requests in flight hold
    (own, pin, or keep on their chains); ``capacity``: the whole pool (None:
    not given).  The allocation failed because ``free + evictable <
    needed``, so nothing was evicted: the call changed nothing.
    """

    def __init__(self, *, pool: str, needed: int, free: int, evictable: int = 0, held: int = 0,
                 capacity: int | None = None) -> None:
        cap = f"pages of pool {pool}"
        advice = ("retry after requests release" if capacity is None or needed <= capacity
                  else f"the pool has {capacity} in all: allocate fewer tokens at a time, or give it more")
        HkvError.__init__(self, f"out of pages: {pool} needs {needed}, {free} free, eviction could free {evictable} "
                                f"more, {held} held by requests in flight; nothing was evicted or changed: {advice}",
                          cap=cap, limit=free, needed=needed, pool=pool, free=free, evictable=evictable, held=held,
                          capacity=capacity)
        self.cap, self.limit, self.needed = cap, free, needed
        self.pool, self.free, self.evictable, self.held, self.capacity = pool, free, evictable, held, capacity


class UnknownRequest(HkvError):
    """A request id that the manager does not know (released or never created)."""

    def __init__(self, *, request_id: int, action: str) -> None:
        super().__init__(f"{action}: unknown request {request_id} (released or never created)",
                         request_id=request_id, action=action)
        self.request_id, self.action = request_id, action


class InvalidRequestState(HkvError):
    """An API call out of order or with bad arguments for this request (e.g. allocate beyond its tokens)."""

    def __init__(self, *, request_id: int, action: str, reason: str) -> None:
        super().__init__(f"{action} on request {request_id}: {reason}",
                         request_id=request_id, action=action, reason=reason)
        self.request_id, self.action, self.reason = request_id, action, reason


class InvalidArgument(HkvError, ValueError):
    """An argument of a call has the wrong type or is out of range; nothing changed.

    ``action`` names the call, ``argument`` the parameter, ``value`` what was
    given and ``reason`` what it must be; ``request_id`` is the request the
    call was about (None when there is none yet, as in ``add_request``).
    Also a ValueError, as Python's own argument errors are.
    """

    def __init__(self, *, action: str, argument: str, value: object, reason: str,
                 request_id: int | None = None) -> None:
        where = action if request_id is None else f"{action} on request {request_id}"
        HkvError.__init__(self, f"{where}: {argument}={shown(value)}: {reason}", action=action, argument=argument,
                          value=value, reason=reason, request_id=request_id)
        self.action, self.argument, self.value, self.reason = action, argument, value, reason
        self.request_id = request_id


class InvalidRequestArgument(InvalidRequestState, InvalidArgument):  # type: ignore[misc]  # request_id: an int here
    """A bad argument of a call on a live request (a token count, a hit): an InvalidArgument naming the
    argument and its value, and an InvalidRequestState (the call on that request was refused)."""

    def __init__(self, *, request_id: int, action: str, argument: str, value: object, reason: str) -> None:
        InvalidArgument.__init__(self, action=action, argument=argument, value=value, reason=reason,
                                 request_id=request_id)


class InvalidExecutorState(HkvError):
    """An executor call out of order (``action``, ``reason``): a plan, read or write before `bind`, a second
    `bind` (pools are static); nothing changed."""

    def __init__(self, *, action: str, reason: str) -> None:
        super().__init__(f"{action}: {reason}", action=action, reason=reason)
        self.action, self.reason = action, reason


class UnknownPlan(HkvError):
    """`complete` or `verify` named a plan id the manager has not issued or already completed."""

    def __init__(self, *, plan_id: int, action: str) -> None:
        super().__init__(f"{action}: plan {plan_id} is not in flight (never issued or already completed)",
                         plan_id=plan_id, action=action)
        self.plan_id, self.action = plan_id, action


class CacheBusy(HkvError):
    """The whole cache cannot be cleared while requests are in flight (their leases pin what they read)."""

    def __init__(self, *, action: str, live_requests: int) -> None:
        super().__init__(f"{action}: {live_requests} request(s) in flight; release them first",
                         action=action, live_requests=live_requests)
        self.action, self.live_requests = action, live_requests


class InvariantViolation(HkvError):
    """The debug flag found a broken invariant after a manager call."""

    def __init__(self, *, action: str, violations: list[str]) -> None:
        super().__init__(f"after {action}: {'; '.join(violations[:5])}", action=action, violations=violations)
        self.action, self.violations = action, violations


class UnknownPool(HkvError):
    """A pool name the executor (or layout) does not have; ``known`` lists the names it has."""

    def __init__(self, *, pool: str, known: tuple[str, ...], action: str) -> None:
        listed = ", ".join(known) or "(none bound: call bind first)"
        super().__init__(f"{action}: unknown pool {pool!r}; known pools: {listed}",
                         pool=pool, known=known, action=action)
        self.pool, self.known, self.action = pool, known, action


class MissingDependency(HkvError, ImportError):
    """An optional dependency is not installed; the message names the extra that installs it.

    Also an ``ImportError``, so ``except ImportError`` catches it as well.
    """

    def __init__(self, *, package: str, extra: str, action: str) -> None:
        super().__init__(f"{action} needs {package}, which is not installed: pip install 'hkv[{extra}]'",
                         package=package, extra=extra, action=action)
        self.package, self.extra, self.action = package, extra, action
        self.name = package  # ImportError's attribute: the module that could not be imported


class NoDevice(HkvError):
    """CuPy is installed but no CUDA device can be used (``reason``: what the CUDA runtime said)."""

    def __init__(self, *, reason: str) -> None:
        super().__init__(f"no usable CUDA device: {reason}; the NumPy stand-in (numpy_backend()) runs without one",
                         reason=reason)
        self.reason = reason


class GraphAddressChanged(HkvError):
    """A captured CUDA Graph would read an address that moved or a buffer it was not captured over (``graph``,
    ``what``, ``captured`` and ``found``): refused, never silently re-captured (docs/cuda_executor.md)."""

    def __init__(self, *, graph: str, what: str, captured: object, found: object) -> None:
        super().__init__(f"graph {graph!r}: {what} was captured as {captured!r}, found {found!r}; capture a new "
                         "graph instead", graph=graph, what=what, captured=captured, found=found)
        self.graph, self.what, self.captured, self.found = graph, what, captured, found


class TierError(HkvError):
    """A host or disk tier could not do what was asked (``tier``, ``record``, ``reason``; ``errno`` from the
    operating system when it refused).  Nothing was published: a record is visible only once durable."""

    def __init__(self, *, tier: str, record: str, reason: str, errno: int | None = None) -> None:
        super().__init__(f"{tier} tier: record {record!r}: {reason}", tier=tier, record=record, reason=reason,
                         errno=errno)
        self.tier, self.record, self.reason, self.errno = tier, record, reason, errno


class TierFull(TierError):
    """A record does not fit the tier's byte budget (``needed``, ``free`` and ``budget`` bytes)."""

    def __init__(self, *, tier: str, record: str, needed: int, free: int, budget: int) -> None:
        super().__init__(tier=tier, record=record,
                         reason=f"needs {needed:,} bytes, {free:,} of the budget of {budget:,} are free")
        self.fields.update(needed=needed, free=free, budget=budget)
        self.needed, self.free, self.budget = needed, free, budget


class RecordCorrupt(TierError):
    """A stored record failed its check (bad magic or version, torn header, checksum mismatch, another
    layout's record); it is quarantined and never served."""
