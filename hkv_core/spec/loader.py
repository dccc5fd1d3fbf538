"""Load `specs/lifecycle.toml` into frozen records, rejecting any malformed spec.

Checks: unknown or missing keys, unknown states, duplicate (state, event),
unreachable states, dead-end states not marked final, guard / effect /
invariant names not registered in `hkv_core.spec.names`.  A failing load
raises SpecError naming file, table and key, and returns nothing.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from types import MappingProxyType

from hkv_core.spec.names import EFFECT_NAMES, GUARD_NAMES, INVARIANT_NAMES
from hkv_core.spec.records import SELF_DEST, InvariantSpec, KindSpec, LifecycleSpec, TransitionSpec
from hkv_core.spec.toml_fields import TableReader, read_toml
from hkv_core.spec_paths import specs_dir

_META_KEYS = {"version", "device_kinds", "index_kinds", "lease_events", "reference_events",
              "device_resident_states", "frozen_states", "copy_states", "indexable_states", "snapshot_kinds"}
_KIND_KEYS = {"description", "initial", "final", "states", "transitions"}
_EDGE_KEYS = {"source", "sources", "event", "dest", "guards", "effects"}


def default_lifecycle_path() -> Path:
    """The shipped `specs/lifecycle.toml`."""
    return specs_dir() / "lifecycle.toml"


def load_lifecycle(path: Path | str | None = None) -> LifecycleSpec:
    """Load and fully validate a lifecycle spec (the shipped one by default)."""
    file_path = Path(path) if path is not None else default_lifecycle_path()
    root = TableReader(str(file_path), "", read_toml(file_path))
    root.only({"meta", "kinds", "references", "invariants"})
    kinds_table = root.sub("kinds")
    kinds = {str(name): _load_kind(kinds_table.sub(str(name), kind=str(name)), str(name)) for name in kinds_table.data}
    if not kinds:
        raise kinds_table.fail("*", "no object kinds declared")
    meta = root.sub("meta")
    meta.only(_META_KEYS)
    all_states = {s for k in kinds.values() for s in k.states}
    all_events = {e for k in kinds.values() for e in k.events}
    device_kinds = _known(meta, "device_kinds", set(kinds))
    index_kinds = _known(meta, "index_kinds", set(kinds) - set(device_kinds))
    spec = LifecycleSpec(
        source=str(file_path),
        version=meta.int_("version", minimum=1),
        device_kinds=device_kinds,
        index_kinds=index_kinds,
        lease_events=frozenset(_known(meta, "lease_events", all_events)),
        reference_events=frozenset(_known(meta, "reference_events", all_events)),
        device_resident_states=frozenset(_known(meta, "device_resident_states", all_states)),
        frozen_states=frozenset(_known(meta, "frozen_states", all_states)),
        copy_states=frozenset(_known(meta, "copy_states", all_states)),
        indexable_states=frozenset(_known(meta, "indexable_states", all_states)),
        snapshot_kinds=frozenset(_known(meta, "snapshot_kinds", set(device_kinds))),
        references=_load_references(root.sub("references"), index_kinds, device_kinds),
        kinds=MappingProxyType(kinds),
        invariants=_load_invariants(root.sub("invariants")),
    )
    return spec


def _load_references(table: TableReader, index_kinds: tuple[str, ...],
                     device_kinds: tuple[str, ...]) -> MappingProxyType[str, tuple[str, ...]]:
    """Which device kinds each index kind refers to: one entry per index kind, device kinds only."""
    table.only(set(index_kinds))
    refs = {kind: _known(table, kind, set(device_kinds)) for kind in index_kinds}
    return MappingProxyType(refs)


def _known(table: TableReader, key: str, universe: set[str]) -> tuple[str, ...]:
    values = table.strs(key)
    for value in values:
        if value not in universe:
            raise table.fail(key, f"unknown name {value!r}")
    return values


def _load_kind(table: TableReader, name: str) -> KindSpec:
    table.only(_KIND_KEYS)
    states = table.strs("states")
    if not states:
        raise table.fail("states", "a kind needs at least one state")
    initial = table.str_("initial")
    if initial not in states:
        raise table.fail("initial", f"unknown state {initial!r}: the initial state must be one of the kind's "
                                    f"states ({', '.join(states)})")
    final = frozenset(_known(table, "final", set(states)))
    edges = _load_edges(table, name, set(states))
    kind = KindSpec(name=name, description=table.str_("description"), initial=initial,
                    final=final, states=states, transitions=edges)
    _check_graph(table, kind)
    return kind


def _load_edges(table: TableReader, kind: str, states: set[str]) -> tuple[TransitionSpec, ...]:
    raw = table.raw("transitions")
    if not isinstance(raw, list) or not raw:
        raise table.fail("transitions", "expected a non-empty list of transition tables")
    edges: dict[tuple[str, str], TransitionSpec] = {}
    for index, item in enumerate(raw):
        edge = TableReader(table.file, f"{table.table}.transitions[{index}]", item, kind)
        for t in _load_edge(edge, kind, states):
            if (t.source, t.event) in edges:
                raise edge.fail("event", f"duplicate transition for (state {t.source!r}, event {t.event!r})")
            edges[(t.source, t.event)] = t
    return tuple(edges.values())


def _load_edge(edge: TableReader, kind: str, states: set[str]) -> list[TransitionSpec]:
    edge.only(_EDGE_KEYS)
    if ("source" in edge.data) == ("sources" in edge.data):
        raise edge.fail("source", "give exactly one of 'source' or 'sources'")
    sources = (edge.str_("source"),) if "source" in edge.data else edge.strs("sources")
    for source in sources:
        if source not in states:
            raise edge.fail("source", f"unknown state {source!r}")
    dest = edge.str_("dest")
    if dest != SELF_DEST and dest not in states:
        raise edge.fail("dest", f"unknown state {dest!r}")
    guards = _registered(edge, "guards", GUARD_NAMES)
    effects = _registered(edge, "effects", EFFECT_NAMES)
    event = edge.str_("event")
    return [TransitionSpec(kind=kind, source=s, event=event, dest=s if dest == SELF_DEST else dest,
                           guards=guards, effects=effects) for s in sources]


def _registered(edge: TableReader, key: str, registry: frozenset[str]) -> tuple[str, ...]:
    names = edge.strs(key, default=())
    for name in names:
        if name not in registry:
            raise edge.fail(key, f"{key[:-1]} {name!r} is not registered in hkv_core.spec.names")
    return names


def _check_graph(table: TableReader, kind: KindSpec) -> None:
    seen, todo = {kind.initial}, deque([kind.initial])
    while todo:
        state = todo.popleft()
        for t in kind.transitions:
            if t.source == state and t.dest not in seen:
                seen.add(t.dest)
                todo.append(t.dest)
    for state in kind.states:
        if state not in seen:
            raise table.fail("states", f"state {state!r} is unreachable from {kind.initial!r}")
        leaves = not any(t.source == state and t.dest != state for t in kind.transitions)
        if leaves and state not in kind.final:
            raise table.fail("final", f"dead-end state {state!r} is not marked final")
        if not leaves and state in kind.final:
            raise table.fail("final", f"final state {state!r} has outgoing transitions")


def _load_invariants(table: TableReader) -> tuple[InvariantSpec, ...]:
    result = []
    for name in table.data:
        entry = table.sub(str(name))
        entry.only({"failure", "description"})
        if name not in INVARIANT_NAMES:
            raise entry.fail("*", f"invariant {name!r} is not registered in hkv_core.spec.names")
        failure = entry.str_("failure")
        if not (failure.startswith("F") and failure[1:].isdigit()):
            raise entry.fail("failure", f"expected a failure row of docs/failures.md like 'F3', got {failure!r}")
        result.append(InvariantSpec(name=str(name), failure=failure, description=entry.str_("description")))
    if not result:
        raise table.fail("*", "no invariants declared")
    return tuple(result)
