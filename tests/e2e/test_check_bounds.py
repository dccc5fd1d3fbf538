"""The model checkers' bounds behind `hkv check`: out-of-range arguments are typed errors, and a state cap
stops the search from growing (every state found is still checked) and says so."""

from __future__ import annotations

import attrs
import pytest

from hkv_cli.check_cmd import exit_status
from hkv_cli.errors import FAILED, OK, TRUNCATED
from hkv_core.checker import CheckConfig, Violation, check
from hkv_core.checker import world as bound
from hkv_core.checker.impl import MAX_DEPTH, MAX_STATES, ImplCheckConfig, check_implementation
from hkv_core.errors import InvalidArgument
from hkv_core.spec import load_lifecycle


@pytest.mark.parametrize(("name", "value"), [
    ("prefixes", 0), ("prefixes", bound.MAX_PREFIXES + 1), ("requests", 0), ("requests", bound.MAX_REQUESTS + 1),
    ("device_slots", 0), ("device_slots", bound.MAX_DEVICE_SLOTS + 1), ("max_depth", -1),
    ("max_depth", bound.MAX_DEPTH + 1), ("max_states", 0), ("max_states", bound.MAX_STATES + 1),
    ("seeded_prefixes", 3), ("rows_per_segment", 0), ("version_cap", -1), ("prefixes", "2")])
def test_check_config_out_of_range_is_invalid_argument(name: str, value: object) -> None:
    with pytest.raises(InvalidArgument) as err:
        CheckConfig(**{name: value})  # seeded_prefixes 3 > the default 2 prefixes
    assert err.value.fields["action"] == "CheckConfig" and err.value.fields["argument"] == name
    assert err.value.fields["value"] == value


@pytest.mark.parametrize(("name", "value"), [("max_depth", -1), ("max_depth", MAX_DEPTH + 1), ("max_states", 0),
                                             ("max_states", MAX_STATES + 1)])
def test_impl_check_config_out_of_range_is_invalid_argument(name: str, value: int) -> None:
    with pytest.raises(InvalidArgument) as err:
        ImplCheckConfig(**{name: value})
    assert err.value.fields["argument"] == name and err.value.fields["value"] == value


def test_the_abstract_check_stops_growing_at_its_cap_and_checks_what_it_found() -> None:
    spec = load_lifecycle()
    small = CheckConfig(prefixes=1, requests=1, max_depth=3, seeded_prefixes=1)
    whole = check(spec, small)
    assert not whole.truncated and whole.states_explored > 40
    capped = check(spec, attrs.evolve(small, max_states=40))
    assert capped.truncated and capped.states_explored == 40
    assert capped.invariants_checked == 40 * len(capped.invariant_names)  # every world found was checked
    exact = check(spec, attrs.evolve(small, max_states=whole.states_explored))
    assert not exact.truncated, "a cap the search exactly fills leaves nothing unexplored"


def test_the_implementation_check_stops_growing_at_its_cap() -> None:
    whole = check_implementation(ImplCheckConfig(max_depth=2))
    assert not whole.truncated and whole.states_explored > 10
    capped = check_implementation(ImplCheckConfig(max_depth=2, max_states=10))
    assert capped.truncated and capped.states_explored == 10
    exact = check_implementation(ImplCheckConfig(max_depth=2, max_states=whole.states_explored))
    assert not exact.truncated


def test_violations_outrank_truncation_in_the_exit_status() -> None:
    result = check(load_lifecycle(), CheckConfig(prefixes=1, requests=1, max_depth=1, seeded_prefixes=0))
    assert exit_status(result, []) == OK
    assert exit_status(attrs.evolve(result, truncated=True), []) == TRUNCATED
    broken = attrs.evolve(result, truncated=True,
                          violations=(Violation(invariant="no_slot_leak", message="m", trace=()),))
    assert exit_status(broken, []) == FAILED
    impl = check_implementation(ImplCheckConfig(max_depth=1, max_states=2))
    assert impl.truncated and exit_status(result, [impl]) == TRUNCATED
