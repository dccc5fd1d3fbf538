"""The compiled table and the transitions.Machine oracle agree on every move."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hkv_core.errors import IllegalTransition
from hkv_core.spec import compile_lifecycle, load_lifecycle
from hkv_core.spec.guards import GUARDS
from hkv_core.spec.oracle import OracleModel, build_machine, oracle_step
from hkv_core.spec.records import KindSpec
from hkv_core.spec.table import KindTable
from hkv_core.testing.guard_views import FixedView, permissive, refusing

SPEC = load_lifecycle()
TABLES = compile_lifecycle(SPEC)


def table_outcome(table: KindTable, state: str, event: str, view: FixedView) -> str:
    try:
        edge = table.step(table.state_index[state], table.event_index[event], view)
    except IllegalTransition as err:
        return f"illegal:{err.guard}"
    return table.states[edge.dest]


def oracle_outcome(kind: KindSpec, state: str, event: str, view: FixedView) -> str:
    model = OracleModel(view)
    build_machine(kind, model)
    model.state = state
    try:
        return oracle_step(kind, model, event)
    except IllegalTransition as err:
        assert model.state == state, "a refused oracle move must change nothing"
        return f"illegal:{err.guard}"


VIEWS = [permissive(), refusing()]


def test_the_two_views_split_every_guard() -> None:
    """Each guard passes on exactly one of the two views, so the walk below takes every guarded edge both ways."""
    for name, guard in GUARDS.items():
        assert [bool(guard(view)) for view in VIEWS].count(True) == 1, name


def test_walk_covers_every_kind() -> None:
    assert set(SPEC.kinds) == set(SPEC.device_kinds) | set(SPEC.index_kinds) | set(SPEC.record_kinds)
    assert {"block", "resume_point"} <= set(SPEC.index_kinds)


@pytest.mark.parametrize("kind_name", list(SPEC.kinds))
def test_every_state_event_pair_agrees(kind_name: str) -> None:
    kind, table = SPEC.kind(kind_name), TABLES[kind_name]
    pairs = list(itertools.product(kind.states, kind.events))
    assert len(pairs) == len(table.states) * len(table.events)
    legal, refused = 0, set[str]()
    for (state, event), view in itertools.product(pairs, VIEWS):
        got, want = table_outcome(table, state, event, view), oracle_outcome(kind, state, event, view)
        assert got == want, (kind_name, state, event, view)
        legal += not got.startswith("illegal")
        if got.startswith("illegal:"):
            refused.add(got.removeprefix("illegal:"))
    assert legal > 0
    first_guards = {t.guards[0] for t in kind.transitions if t.guards}
    assert first_guards <= refused, "every edge's first guard is seen refusing"


def test_illegal_transition_carries_fields() -> None:
    table = TABLES["compressed_kv"]
    with pytest.raises(IllegalTransition) as info:
        table.step(table.state_index["FREE"], table.event_index["publish"], FixedView())
    assert info.value.fields == {"kind": "compressed_kv", "state": "FREE", "event": "publish", "guard": None}
    with pytest.raises(IllegalTransition) as info:
        table.step(table.state_index["PUBLISHED"], table.event_index["evict"], FixedView(leases=1))
    assert info.value.guard == "unpinned"


views = st.builds(FixedView, slot_free=st.booleans(), owner=st.booleans(), full=st.booleans(),
                  leased_by_me=st.booleans(), leases=st.integers(0, 2), copying=st.booleans(),
                  targets=st.booleans(), loading=st.integers(0, 1),
                  held_by=st.integers(0, 2), rows=st.integers(0, 2), parent=st.booleans(),
                  child_count=st.integers(0, 1), tail=st.booleans(), point=st.booleans(), block=st.booleans())


@given(kind_name=st.sampled_from(list(SPEC.kinds)), data=st.data())
def test_lockstep_random_event_sequences(kind_name: str, data: st.DataObject) -> None:
    kind, table = SPEC.kind(kind_name), TABLES[kind_name]
    model = OracleModel()
    build_machine(kind, model)
    state = table.initial
    for _ in range(data.draw(st.integers(1, 40))):
        event = data.draw(st.sampled_from(kind.events))
        model.view = data.draw(views)
        try:
            state = table.step(state, table.event_index[event], model.view).dest
            want: str | None = None
        except IllegalTransition as err:
            want = err.guard or "none"
        try:
            got_state = oracle_step(kind, model, event)
            got: str | None = None
        except IllegalTransition as err:
            got, got_state = err.guard or "none", model.state
        assert got == want and got_state == table.states[state]
