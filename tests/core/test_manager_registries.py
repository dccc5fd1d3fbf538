"""The manager, the spec and the model checker use the same names.

- effects: the manager's object effects, its index-entry effects, the checker's
  effects and the spec's EFFECT_NAMES are one set, and every effect a spec
  transition names is really implemented for the subjects it moves (device
  objects or index entries), not one of the registry's refusals;
- invariants: the live manager's, the checker's, the spec's and INVARIANT_NAMES;
- events and states: every member of `Event` / `State` exists in the shipped
  spec, a manager builds on every preset, and a spec lacking an event the
  manager fires is refused when the manager is built (SpecError), not when the
  event first fires.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hkv_core.checker import effects as checker_effects
from hkv_core.checker import invariants as checker_invariants
from hkv_core.errors import SpecError
from hkv_core.layout import Layout, preset_names
from hkv_core.manager import CacheManager, ManagerConfig, object_effects
from hkv_core.manager import invariants as manager_invariants
from hkv_core.manager.core import Core
from hkv_core.manager.index.entries import ENTRY_EFFECTS
from hkv_core.manager.lanes import build_lanes
from hkv_core.manager.roles import events_fired
from hkv_core.spec import compile_lifecycle, load_lifecycle
from hkv_core.spec.names import EFFECT_NAMES, INVARIANT_NAMES, Event, State
from hkv_core.spec.records import LifecycleSpec
from hkv_core.testing.spec_mutation import mutated_spec

SMALL = ManagerConfig(default_pool_pages=8, max_requests=4, key_seed=0)
RETIRE_LINE = '  { source = "PUBLISHED", event = "retire", dest = "RETIRED", guards = ["unheld"], effects = [] },\n'


OBJECT_EFFECTS: Mapping[str, Callable[..., Any]] = object_effects.EFFECTS


def refused(effect: Callable[..., Any]) -> bool:
    """Is this registry entry one of the refusals (an effect that belongs to the other subject)?"""
    return ".<locals>." in effect.__qualname__ and effect.__qualname__.startswith("_not_for")


def test_effect_registries_agree() -> None:
    assert set(OBJECT_EFFECTS) == EFFECT_NAMES
    assert set(ENTRY_EFFECTS) == EFFECT_NAMES
    assert set(checker_effects.EFFECTS) == EFFECT_NAMES


def test_every_effect_the_spec_names_is_implemented_for_what_it_moves() -> None:
    spec = load_lifecycle()
    device = {e for k in spec.device_kinds for t in spec.kind(k).transitions for e in t.effects}
    index = {e for k in spec.index_kinds for t in spec.kind(k).transitions for e in t.effects}
    assert device and index
    assert not [e for e in device if refused(OBJECT_EFFECTS[e])], "device transitions name entry-only effects"
    assert not [e for e in index if refused(ENTRY_EFFECTS[e])], "index transitions name object-only effects"
    # and each registry refuses exactly what belongs to the other subject
    objects_real = {e for e, f in OBJECT_EFFECTS.items() if not refused(f)}
    entries_real = {e for e, f in ENTRY_EFFECTS.items() if not refused(f)}
    assert objects_real | entries_real == EFFECT_NAMES
    assert {"take_row", "free_row", "hold_references", "drop_references"} <= entries_real - objects_real
    assert {"take_slot", "add_lease", "add_holder"} <= objects_real - entries_real


def test_refusals_refuse() -> None:
    with pytest.raises(AssertionError, match="belongs to index entries"):
        OBJECT_EFFECTS["take_row"](None, np.zeros(0, np.intp), -1, None)
    with pytest.raises(AssertionError, match="belongs to device objects"):
        ENTRY_EFFECTS["take_slot"](CacheManager(Layout.from_preset("llama_full"), SMALL).core.index.blocks,
                                   np.zeros(0, np.intp), ())


def test_invariant_registries_agree() -> None:
    assert set(manager_invariants.INVARIANTS) == INVARIANT_NAMES
    assert set(checker_invariants.INVARIANTS) == INVARIANT_NAMES
    assert {inv.name for inv in load_lifecycle().invariants} == INVARIANT_NAMES


def spec_names(spec: LifecycleSpec) -> tuple[set[str], set[str]]:
    states, events = set[str](), set[str]()
    for kind in spec.kinds.values():
        states |= set(kind.states)
        events |= {t.event for t in kind.transitions}
    return states, events


def test_every_state_and_event_the_code_names_is_in_the_spec() -> None:
    states, events = spec_names(load_lifecycle())
    assert {s.value for s in State} <= states, sorted({s.value for s in State} - states)
    assert {e.value for e in Event} <= events, sorted({e.value for e in Event} - events)


@pytest.mark.parametrize("preset", preset_names())
def test_a_manager_builds_on_every_preset_and_its_events_resolve(preset: str) -> None:
    layout = Layout.from_preset(preset)
    m = CacheManager(layout, SMALL)
    tables = compile_lifecycle(m.core.spec)
    lanes = build_lanes(layout, SMALL)
    for lane in lanes:
        for event in events_fired(lanes)[lane.index]:
            assert event in tables[lane.kind].event_index, (preset, lane.name, event)
    assert m.core.objects.rules, "the manager compiled the rules of the events it fires"


@pytest.fixture()
def without_retire(tmp_path: Path) -> LifecycleSpec:
    """The shipped spec with window pages unable to retire (the event renamed: RETIRED stays reachable)."""
    return load_lifecycle(mutated_spec(tmp_path, 'event = "retire"', 'event = "expire"'))


@pytest.mark.parametrize("preset", ["tiny_v4", "swa_full", "deepseek_v4_flash"])
def test_a_spec_lacking_an_event_the_manager_fires_is_refused_at_construction(
        preset: str, without_retire: LifecycleSpec) -> None:
    with pytest.raises(SpecError, match="retire") as err:
        Core(Layout.from_preset(preset), SMALL, spec=without_retire)
    assert err.value.fields["table"] == "kinds.swa_window"


def test_only_the_events_fired_are_required(without_retire: LifecycleSpec) -> None:
    """llama_full has no window pools: nothing fires retire, so the same spec is accepted there."""
    core = Core(Layout.from_preset("llama_full"), SMALL, spec=without_retire)
    assert Event.RETIRE not in core.objects.rules


def test_deleting_the_retire_line_is_refused_already_by_the_loader(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="RETIRED"):
        load_lifecycle(mutated_spec(tmp_path, RETIRE_LINE, ""))


@pytest.mark.parametrize(("kind", "line", "renamed"), [
    ("block", '{ source = "INDEXED", event = "attach"', '{ source = "INDEXED", event = "attach_more"'),
    ("resume_point", '{ source = "FREE", event = "keep"', '{ source = "FREE", event = "keep_more"')])
def test_a_spec_lacking_an_index_event_is_refused_at_construction(
        tmp_path: Path, kind: str, line: str, renamed: str) -> None:
    spec = load_lifecycle(mutated_spec(tmp_path, line, renamed))
    with pytest.raises(SpecError, match=renamed.split('"')[-2].removesuffix("_more")) as err:
        Core(Layout.from_preset("tiny_v4"), SMALL, spec=spec)
    assert err.value.fields["table"] == f"kinds.{kind}"
