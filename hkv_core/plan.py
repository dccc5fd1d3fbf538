"""Plans: short lists of typed, frozen ops an executor carries out (docs/executor.md).

The manager never touches bytes; it issues plans.  A plan is data: it prints
(`Plan.describe`), compares (`==`), serializes (`to_json` / `from_json`) and
replays (the same plan given to the NumPy and the CUDA executor must leave
the same pool bytes).  Every op names the page versions its lease checked;
an executor asks the manager to verify them when it launches the plan (under
the manager's lock) and refuses the whole plan if any moved (F2 / F3).  A plan
the manager issued carries a `plan_id`; its result goes back through
`CacheManager.complete(plan_id, completion)`, which fires the lifecycle's
completion events (the copy into a FILLING page is done).

Ops (one pool each; a page holds `entries_per_page` entries of every layer):

- `CopyPages`: the first `entries` entries of page `src` into page `dst`
  (copy-on-write of a partial prefix page, seeding a working tail page).
- `FillPages`: set every byte of `pages` to `value` (a reserved dummy page).
- `Checksum`: a digest per page (`page_digest` of its bytes).
- `StoreRecord`: copy row runs of pages into a tier record's host bytes.
- `LoadRecord`: copy a tier record's host bytes into row runs of pages.

The two record ops are the one path between the pools and the tiers: a
record's bytes are a host buffer the plan names (`record`) and the caller
hands to `Executor.run(plan, records={name: buffer})`; each op moves the rows
of its runs, in order, to or from bytes [offset, offset + nbytes) of that
buffer, laid out (layers, rows, *entry_shape) in the pool's dtype.

This module depends only on attrs and the units module (plans sit beside the
manager, not above or below it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from hkv_core.errors import InvalidArgument
from hkv_core.units import NULL_PAGE

__all__ = ["DIGEST_BYTES", "JSON_FORMAT", "NO_PLAN", "OP_TYPES", "Checksum", "Completion", "CopyPages", "FillPages",
           "LoadRecord", "Op", "Plan", "RecordOp", "RecordRows", "StoreRecord", "VersionCheck", "page_digest",
           "version_checks"]

DIGEST_BYTES = 16  # blake2b-128 per page: collisions are not a concern for checksums of cache pages
# the format tag Plan.to_json writes and from_json checks (v3: record ops move row runs to and from host bytes)
JSON_FORMAT = "hkv.plan/v3"
NO_PLAN = -1  # plan_id of a plan the manager did not issue (built by hand, for tests or replay)


def _pages(value: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


def _check_versions(op: Any, attribute: Any, value: tuple[int, ...]) -> None:
    if len(value) != len(op.pages):
        raise InvalidArgument(action=type(op).__name__, argument="versions", value=value,
                              reason=f"one version per page, and the op has {len(op.pages)} pages {op.pages}")


@attrs.frozen(kw_only=True)
class CopyPages:
    """Copy the first `entries` entries of `src` into `dst` in one pool.

    `src_version` is the version the lease checked; the plan is refused at
    launch if it moved.
    """

    pool: str
    src: int
    dst: int
    entries: int
    src_version: int


@attrs.frozen(kw_only=True)
class FillPages:
    """Set every byte of `pages` of `pool` to `value` (0..255): scrub or prepare a dummy page."""

    pool: str
    pages: tuple[int, ...] = attrs.field(converter=_pages)
    versions: tuple[int, ...] = attrs.field(converter=_pages, validator=_check_versions)
    value: int = 0

    def __attrs_post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, int) or not 0 <= self.value <= 255:
            raise InvalidArgument(action="FillPages", argument="value", value=self.value,
                                  reason="a fill byte is 0..255")


@attrs.frozen(kw_only=True)
class Checksum:
    """A digest (`page_digest`) of each page of `pages`, returned in the completion."""

    pool: str
    pages: tuple[int, ...] = attrs.field(converter=_pages)
    versions: tuple[int, ...] = attrs.field(converter=_pages, validator=_check_versions)


def _runs(value: Sequence[Sequence[int]]) -> tuple[tuple[int, int, int], ...]:
    return tuple((int(page), int(first), int(stop)) for page, first, stop in value)


def _check_runs(op: Any, attribute: Any, value: tuple[tuple[int, int, int], ...]) -> None:
    bad = [run for run in value if not 0 <= run[1] < run[2]]
    if not value or bad:
        raise InvalidArgument(action=type(op).__name__, argument="runs", value=value,
                              reason="one or more (page, first, stop) runs, each with 0 <= first < stop"
                              + (f": {bad[0]}" if bad else ""))


def _check_run_versions(op: Any, attribute: Any, value: tuple[int, ...]) -> None:
    if len(value) != len(op.runs):
        raise InvalidArgument(action=type(op).__name__, argument="versions", value=value,
                              reason=f"one version per run, and the op has {len(op.runs)} runs")


def _check_offset(op: Any, attribute: Any, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(action=type(op).__name__, argument="offset", value=value,
                              reason="a byte offset into the record >= 0")


class _RowRuns:
    """The pages and row count of a record op's runs."""

    runs: tuple[tuple[int, int, int], ...]

    @property
    def pages(self) -> tuple[int, ...]:
        return tuple(page for page, _, _ in self.runs)

    @property
    def rows(self) -> int:
        return sum(stop - first for _, first, stop in self.runs)


@attrs.frozen(kw_only=True)
class StoreRecord(_RowRuns):
    """Copy entries [first, stop) of each run's page of `pool` (every layer), in order, into bytes from `offset`
    of record `record`'s host buffer, laid out (layers, first_row + rows, *entry_shape): rows [first_row, ...)
    of each layer (`first_row`: rows of the piece the op leaves alone)."""

    pool: str
    runs: tuple[tuple[int, int, int], ...] = attrs.field(converter=_runs, validator=_check_runs)
    versions: tuple[int, ...] = attrs.field(converter=_pages, validator=_check_run_versions)
    record: str
    offset: int = attrs.field(default=0, validator=_check_offset)
    first_row: int = attrs.field(default=0, validator=_check_offset)


@attrs.frozen(kw_only=True)
class LoadRecord(_RowRuns):
    """Copy bytes from `offset` of record `record`'s host buffer, laid out (layers, first_row + rows,
    *entry_shape) - rows [first_row, ...) of each layer - in order into entries [first, stop) of each run's page
    of `pool` (never the NULL page)."""

    pool: str
    runs: tuple[tuple[int, int, int], ...] = attrs.field(converter=_runs, validator=_check_runs)
    versions: tuple[int, ...] = attrs.field(converter=_pages, validator=_check_run_versions)
    record: str
    offset: int = attrs.field(default=0, validator=_check_offset)
    first_row: int = attrs.field(default=0, validator=_check_offset)

    def __attrs_post_init__(self) -> None:
        if NULL_PAGE in self.pages:
            raise InvalidArgument(action="LoadRecord", argument="runs", value=self.runs,
                                  reason="nothing is ever loaded into the NULL page (page 0)")


RecordOp = StoreRecord | LoadRecord


@attrs.frozen(kw_only=True)
class RecordRows:
    """What a caller asks the manager to move between a request's pages and a record (`plan_store`,
    `plan_load`): row runs of one pool and where they sit in the record's bytes; the manager adds versions."""

    pool: str
    runs: tuple[tuple[int, int, int], ...] = attrs.field(converter=_runs)
    record: str
    offset: int = 0
    first_row: int = 0  # rows of the record's piece before these (skipped)


Op = CopyPages | FillPages | Checksum | StoreRecord | LoadRecord  # any op a plan may hold
# op class by name, for from_json
OP_TYPES: dict[str, type[Op]] = {t.__name__: t for t in (CopyPages, FillPages, Checksum, StoreRecord, LoadRecord)}


def _ops(value: Sequence[Op]) -> tuple[Op, ...]:
    ops = tuple(value)
    unknown = [op for op in ops if type(op) not in _CHECKS]
    if unknown:
        raise InvalidArgument(action="Plan", argument="ops", value=unknown[0],
                              reason=f"not an op: {type(unknown[0]).__name__} (one of {', '.join(OP_TYPES)})")
    return ops


@attrs.frozen(kw_only=True)
class VersionCheck:
    """One page an op reads or writes (`writes`: a LoadRecord's target, FILLING for its request), and the version
    its lease saw."""

    pool: str
    page: int
    version: int
    writes: bool = False


def _copy_checks(op: CopyPages) -> tuple[VersionCheck, ...]:
    return (VersionCheck(pool=op.pool, page=op.src, version=op.src_version),)


def _page_checks(op: FillPages | Checksum | StoreRecord | LoadRecord) -> tuple[VersionCheck, ...]:
    writes = isinstance(op, LoadRecord)
    return tuple(VersionCheck(pool=op.pool, page=p, version=v, writes=writes)
                 for p, v in zip(op.pages, op.versions, strict=True))


_CHECKS: dict[type, Callable[[Any], tuple[VersionCheck, ...]]] = {
    CopyPages: _copy_checks, FillPages: _page_checks, Checksum: _page_checks,
    StoreRecord: _page_checks, LoadRecord: _page_checks,
}


def version_checks(op: Op) -> tuple[VersionCheck, ...]:
    """The (pool, page, version) triples verified before `op` runs."""
    return _CHECKS[type(op)](op)


def page_digest(page: bytes) -> str:
    """The checksum of one page's bytes (C order over (layers, entries, *entry_shape)); every executor
    uses this definition so their checksums compare."""
    return hashlib.blake2b(page, digest_size=DIGEST_BYTES).hexdigest()


@attrs.frozen(kw_only=True)
class Plan:
    """Ops to run in order, all or nothing with respect to version checks.

    `plan_id` is the manager's id for a plan it issued (NO_PLAN otherwise);
    `request_id` the request whose lease the versions come from (-1: none).
    """

    ops: tuple[Op, ...] = attrs.field(converter=_ops)
    request_id: int = -1
    label: str = ""
    plan_id: int = NO_PLAN

    def __len__(self) -> int:
        return len(self.ops)

    def describe(self) -> str:
        """One line per op, for logs and failure messages."""
        head = f"plan {self.plan_id} {self.label or '-'} (request {self.request_id}, {len(self.ops)} ops)"
        return "\n".join([head, *(f"  {i}: {op!r}" for i, op in enumerate(self.ops))])

    def checks(self) -> tuple[VersionCheck, ...]:
        """Every (pool, page, version) the plan relies on, in op order."""
        return tuple(c for op in self.ops for c in version_checks(op))

    def to_json(self) -> str:
        """A JSON document from which `Plan.from_json` rebuilds an equal plan."""
        ops = [{"op": type(op).__name__, **attrs.asdict(op)} for op in self.ops]
        return json.dumps({"format": JSON_FORMAT, "request_id": self.request_id, "label": self.label,
                           "plan_id": self.plan_id, "ops": ops}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        doc = json.loads(text)
        assert doc.get("format") == JSON_FORMAT, f"not an {JSON_FORMAT} document"
        ops = []
        for item in doc["ops"]:
            fields = {k: v for k, v in item.items() if k != "op"}
            ops.append(OP_TYPES[item["op"]](**fields))
        return cls(ops=ops, request_id=int(doc["request_id"]), label=str(doc["label"]),
                   plan_id=int(doc.get("plan_id", NO_PLAN)))


@attrs.frozen(kw_only=True)
class Completion:
    """What running a plan produced: a digest per page of each Checksum op, counts, and whether it worked.

    `ok=False` (with `error`) reports a plan that failed after launch (a copy
    error); the manager then marks the copies' targets unusable.
    """

    digests: tuple[tuple[str, ...], ...] = ()  # one tuple per Checksum op, in plan order
    ops_run: int = 0
    pages_moved: int = 0  # pages copied, filled, stored or loaded (a record op: the pages its runs touch)
    entries_copied: int = 0  # entries moved by CopyPages
    ok: bool = True
    error: str = ""
