"""The model checker explores the shipped spec cleanly and catches every broken variant."""

from pathlib import Path

import pytest

from hkv_core.checker import CheckConfig, check
from hkv_core.checker.effects import EFFECTS
from hkv_core.checker.invariants import INVARIANTS
from hkv_core.spec import load_lifecycle
from hkv_core.spec.guards import GUARDS
from hkv_core.spec.names import EFFECT_NAMES, GUARD_NAMES, INVARIANT_NAMES
from hkv_core.testing.spec_mutation import mutated_spec


def test_registries_match_the_names_a_spec_may_use() -> None:
    from hkv_core.manager import invariants as live_invariants
    from hkv_core.manager import pools

    assert set(GUARDS) == GUARD_NAMES
    assert set(EFFECTS) == EFFECT_NAMES == set(pools.EFFECTS)  # the checker and the manager apply the same
    assert set(INVARIANTS) == INVARIANT_NAMES == set(live_invariants.INVARIANTS)


def test_default_bound_is_clean_and_large() -> None:
    result = check(load_lifecycle())
    assert result.states_explored >= 10_000
    assert result.transitions_explored >= result.states_explored - 1
    assert result.invariants_checked == result.states_explored * len(INVARIANT_NAMES)
    assert not result.truncated
    assert result.violations == ()


SMALL = CheckConfig(prefixes=1, requests=2, device_slots=4, max_depth=3)
DEEP = CheckConfig(prefixes=1, requests=1, device_slots=4, max_depth=6)
CKV_OFFLOAD = '{ source = "PUBLISHED", event = "offload", dest = "OFFLOADING", guards = ["unpinned"], '
DRAFT = '{ source = "FREE", event = "reserve_draft", dest = "DRAFT", guards = ["slot_available"], ' \
        'effects = ["take_slot", "set_owner"] },'
WRITE = '{ sources = ["RESERVED", "DRAFT"], event = "write", dest = "=", guards = ["is_owner", ' \
        '"rows_not_full"], effects = ["append_row"] },'
DELETE_GUARDS = 'guards = ["unpinned", "no_disk_dependents"]'

# (name, old, new, invariant it must break, config)
BROKEN = [
    ("evict a pinned page", 'event = "evict", dest = "FREE", guards = ["unpinned"]',
     'event = "evict", dest = "FREE", guards = []', "pinned_never_freed", SMALL),
    ("offload without a copy pin", CKV_OFFLOAD + 'effects = ["pin_copy"] }', CKV_OFFLOAD + "effects = [] }",
     "copy_endpoints_pinned", SMALL),
    ("retire bumps a leased window", 'event = "retire", dest = "RETIRED", guards = [], effects = []',
     'event = "retire", dest = "RETIRED", guards = [], effects = ["bump_version"]',
     "lease_versions_current", SMALL),
    ("offload a leased page", CKV_OFFLOAD, '{ source = "PUBLISHED", event = "offload", dest = "OFFLOADING", '
     "guards = [], ", "lease_covers_object_set", SMALL),
    ("lease a draft", DRAFT, DRAFT + '\n  { source = "DRAFT", event = "pin", dest = "=", guards = [], '
     'effects = ["add_lease"] },', "draft_isolation", SMALL),
    ("write_done before all rows", 'event = "write_done", dest = "READY", guards = ["is_owner", "rows_full"]',
     'event = "write_done", dest = "READY", guards = ["is_owner"]', "publish_only_when_complete", SMALL),
    ("write into a published page", WRITE, '{ sources = ["RESERVED", "DRAFT", "PUBLISHED"], event = "write", '
     'dest = "=", guards = [], effects = ["append_row"] },', "immutable_when_frozen", SMALL),
    ("reserve without an owner", 'event = "reserve", dest = "RESERVED", guards = ["slot_available"], '
     'effects = ["take_slot", "set_owner"]', 'event = "reserve", dest = "RESERVED", '
     'guards = ["slot_available"], effects = ["take_slot"]', "slot_single_owner", SMALL),
    ("reject leaks its slot", '"clear_owner", "free_slot", "bump_version"', '"clear_owner", "bump_version"',
     "no_slot_leak", SMALL),
    ("unpin keeps the lease", 'event = "unpin", dest = "=", guards = ["leased_by_actor"], '
     'effects = ["drop_lease"]', 'event = "unpin", dest = "=", guards = ["leased_by_actor"], effects = []',
     "refcount_matches_leases", SMALL),
    ("delete a record still needed", DELETE_GUARDS, 'guards = ["unpinned"]', "disk_copy_durable", DEEP),
    ("checksum failure not quarantined", 'effects = ["unpin_copy", "quarantine"]', 'effects = ["unpin_copy"]',
     "disk_copy_durable", DEEP),
]


@pytest.mark.parametrize(("name", "old", "new", "invariant", "config"), BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_spec_variant_is_caught_with_a_trace(
        tmp_path: Path, name: str, old: str, new: str, invariant: str, config: CheckConfig) -> None:
    clean = check(load_lifecycle(), config)
    assert clean.violations == (), "the unbroken spec must pass the same bound"
    result = check(load_lifecycle(mutated_spec(tmp_path, old, new)), config)
    found = {v.invariant: v for v in result.violations}
    assert invariant in found, (name, sorted(found))
    assert found[invariant].trace, "a violation comes with the trace that reaches it"


def test_broken_evict_trace_is_shortest_and_ends_with_the_evict(tmp_path: Path) -> None:
    path = mutated_spec(tmp_path, 'event = "evict", dest = "FREE", guards = ["unpinned"]',
                        'event = "evict", dest = "FREE", guards = []')
    result = check(load_lifecycle(path), SMALL)
    trace = {v.invariant: v for v in result.violations}["pinned_never_freed"].trace
    assert trace[-2].startswith("acquire(") and trace[-1].startswith("evict(")
    assert len(trace) == 4 * 4 + 2  # publish four kinds (4 events each), acquire, evict


def test_every_invariant_is_shown_able_to_fail() -> None:
    shown = {b[3] for b in BROKEN}
    assert shown == INVARIANT_NAMES
