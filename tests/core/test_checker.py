"""The model checker explores the shipped spec cleanly and catches every broken variant."""

import functools
from pathlib import Path
from types import MappingProxyType

import attrs
import pytest

from hkv_core.checker import CheckConfig, CheckResult, check
from hkv_core.checker import effects as effects_module
from hkv_core.checker.effects import EFFECTS
from hkv_core.checker.explore import Explorer, Parents, seed_worlds
from hkv_core.checker.invariants import INVARIANTS
from hkv_core.errors import InvalidArgument
from hkv_core.spec import load_lifecycle
from hkv_core.spec.guards import GUARDS
from hkv_core.spec.names import EFFECT_NAMES, GUARD_NAMES, INVARIANT_NAMES, State
from hkv_core.testing.spec_mutation import mutated_spec


def test_registries_match_the_names_a_spec_may_use() -> None:
    # manager registries: checked in tests/core/test_manager_registries.py
    assert set(GUARDS) == GUARD_NAMES
    assert set(EFFECTS) == EFFECT_NAMES
    assert set(INVARIANTS) == INVARIANT_NAMES


def test_default_bound_is_clean_and_large() -> None:
    result = check(load_lifecycle())
    assert result.states_explored >= 100_000
    assert result.transitions_explored >= result.states_explored - 1
    assert result.invariants_checked == result.states_explored * len(INVARIANT_NAMES)
    assert not result.truncated
    assert result.violations == ()


def test_default_bound_fires_every_ahead_event() -> None:
    """reserve_ahead, writes ahead, append_tokens (the known watermark passing), verify and abort are explored."""
    fired = set(check(load_lifecycle(), _cfg(requests=1, max_depth=4)).events_fired)
    assert {"reserve_ahead", "append_tokens", "verify", "abort"} <= fired, sorted(fired)


def test_default_bound_fires_every_draft_event() -> None:
    """reserve_draft, writes into a draft, accept and reject are explored like every other event."""
    fired = set(check(load_lifecycle(), _cfg(requests=1, max_depth=4)).events_fired)
    assert {"reserve_draft", "write", "accept", "reject"} <= fired, sorted(fired)


def test_lease_events_are_split_by_their_effects() -> None:
    topo = Explorer(load_lifecycle(), CheckConfig()).topo
    assert topo.acquiring_events == ("pin", "publish_pinned")
    assert topo.releasing_events == ("unpin",)


def test_seeds_publish_index_and_hold_through_real_transitions() -> None:
    spec = load_lifecycle()
    explorer = Explorer(spec, CheckConfig())
    topo, parent = explorer.topo, Parents()
    seeds = seed_worlds(explorer, parent)
    assert len(seeds) == 2 + 2 * topo.config.seeded_prefixes
    last, filling = seeds[-2], seeds[-1]
    for s in topo.device_of_prefix[0]:  # where a tier load begins: every object FILLING for request 0
        assert topo.state_name(filling, s) == State.FILLING and filling.segs[s].owner == 0
    for p in range(topo.config.prefixes):
        assert topo.state_name(last, topo.block_of_prefix[p]) == State.INDEXED
        assert topo.state_name(last, topo.point_of_prefix[p]) == State.KEPT
        for s in topo.device_of_prefix[p]:
            assert topo.state_name(last, s) == State.PUBLISHED and last.segs[s].holders == 1
    staged = seeds[1]
    assert all(topo.state_name(staged, s) == State.READY for s in topo.device_of_prefix[0])
    assert all(INVARIANTS[name](topo, seed) is None for seed in seeds for name in INVARIANTS)


def _cfg(**changes: int) -> CheckConfig:
    return attrs.evolve(CheckConfig(prefixes=1, requests=2, device_slots=5, max_depth=3, seeded_prefixes=1),
                        **changes)


SMALL = _cfg()
DEEP = _cfg(requests=1, max_depth=6)
CHAIN = CheckConfig(prefixes=2, requests=1, device_slots=10, max_depth=2, seeded_prefixes=2)
ROOTS = CheckConfig(prefixes=2, requests=1, device_slots=10, max_depth=2, seeded_prefixes=0)
TIER_LOAD = '{ source = "IDLE", event = "load", dest = "LOADING", guards = ["targets_filling"], ' \
            'effects = ["pin_copy"] }'
TARGET_DONE = 'event = "copy_done", dest = "RESERVED", guards = ["no_load_in_flight"]'
CKV_UNPIN = '{ source = "PUBLISHED", event = "unpin", dest = "=", guards = ["leased_by_actor"], ' \
            'effects = ["drop_lease"] },'
DRAFT = '{ source = "FREE", event = "reserve_draft", dest = "DRAFT", guards = ["slot_available"], ' \
        'effects = ["take_slot", "set_owner"] },'
WRITE = '{ sources = ["RESERVED", "DRAFT"], event = "write", dest = "=", guards = ["is_owner", ' \
        '"rows_not_full"], effects = ["append_row"] },'
ACCEPT = '{ source = "DRAFT", event = "accept", dest = "RESERVED", guards = ["is_owner"], effects = [] },'
REJECT = 'event = "reject", dest = "FREE", guards = ["is_owner"], effects = ["clear_rows", "clear_owner", ' \
         '"free_slot", "bump_version"]'
DRAFT_FILL = '{ source = "DRAFT", event = "fill", dest = "DRAFT_FILLING", guards = ["is_owner", "rows_not_full"], ' \
             'effects = '
EVICT = 'event = "evict", dest = "FREE", guards = ["unpinned", "unheld"]'
BLOCK_DROP = 'guards = ["no_children", "not_chain_tail", "no_point"], effects = ["drop_references", '
VERIFY = '{ source = "AHEAD", event = "verify", dest = "RESERVED", guards = ["is_owner", "tokens_known"], ' \
         'effects = [] },'


@attrs.frozen
class Broken:
    """A broken spec variant: `old` -> `new` in the first `count` places; the invariant it must break.

    `first` says the search may end at the first violating world: that world breaks `invariant`.
    """

    name: str
    old: str
    new: str
    invariant: str
    config: CheckConfig
    count: int = 1
    first: bool = True


BROKEN = [
    # the device kinds' lifecycles and leases
    Broken("evict a pinned page", EVICT, 'event = "evict", dest = "FREE", guards = ["unheld"]',
           "pinned_never_freed", SMALL),
    Broken("tier load without a copy pin", TIER_LOAD, TIER_LOAD.replace('["pin_copy"]', "[]"),
           "copy_endpoints_pinned", SMALL),
    Broken("tier load into pages no copy pins", TIER_LOAD, TIER_LOAD.replace('"targets_filling"', ""),
           "tier_loads_pinned", SMALL),
    Broken("a load's targets settle before it", TARGET_DONE, TARGET_DONE.replace('"no_load_in_flight"', ""),
           "tier_loads_pinned", SMALL, count=4),
    Broken("retire bumps a leased window", 'event = "retire", dest = "RETIRED", guards = ["unheld"], effects = []',
           'event = "retire", dest = "RETIRED", guards = ["unheld"], effects = ["bump_version"]',
           "lease_versions_current", SMALL),
    Broken("unfreeze a leased page", CKV_UNPIN, CKV_UNPIN + '\n  { source = "PUBLISHED", event = "seal", '
           'dest = "READY", guards = [], effects = [] },', "lease_covers_object_set", SMALL, first=False),
    Broken("lease a draft", DRAFT, DRAFT + '\n  { source = "DRAFT", event = "pin", dest = "=", guards = [], '
           'effects = ["add_lease"] },', "draft_isolation",
           attrs.evolve(DEEP, device_kinds=("compressed_kv", "recurrent_state")), count=5),  # 2 kinds: 0.1 s
    Broken("accept publishes a draft", ACCEPT, '{ source = "DRAFT", event = "accept", dest = "PUBLISHED", '
           'guards = [], effects = ["clear_owner", "freeze_content"] },', "publish_only_when_complete", SMALL,
           count=4),
    Broken("checkpoint copy into a draft without a copy pin", DRAFT_FILL + '["pin_copy"] }', DRAFT_FILL + "[] }",
           "copy_endpoints_pinned", SMALL, count=2),
    Broken("reject keeps its owner", REJECT, REJECT.replace('"clear_owner", ', ""), "slot_single_owner", SMALL,
           count=4),
    Broken("write_done before all rows", 'event = "write_done", dest = "READY", guards = ["is_owner", "rows_full"]',
           'event = "write_done", dest = "READY", guards = ["is_owner"]', "publish_only_when_complete", SMALL),
    Broken("seal an empty object", 'event = "seal", dest = "READY", guards = ["is_owner", "has_rows"], '
           'effects = ["seal_rows"]', 'event = "seal", dest = "READY", guards = ["is_owner"], effects = []',
           "publish_only_when_complete", _cfg(rows_per_segment=2)),
    Broken("write into a published page", WRITE, '{ sources = ["RESERVED", "DRAFT", "PUBLISHED"], event = "write", '
           'dest = "=", guards = [], effects = ["append_row"] },', "immutable_when_frozen", SMALL),
    Broken("reserve without an owner", 'event = "reserve", dest = "RESERVED", guards = ["slot_available"], '
           'effects = ["take_slot", "set_owner"]', 'event = "reserve", dest = "RESERVED", '
           'guards = ["slot_available"], effects = ["take_slot"]', "slot_single_owner", SMALL),
    Broken("reject leaks its slot", '"clear_owner", "free_slot", "bump_version"', '"clear_owner", "bump_version"',
           "no_slot_leak", SMALL),
    Broken("unpin keeps the lease", 'event = "unpin", dest = "=", guards = ["leased_by_actor"], '
           'effects = ["drop_lease"]', 'event = "unpin", dest = "=", guards = ["leased_by_actor"], effects = []',
           "refcount_matches_leases", SMALL),
    # the prefix index and its references
    Broken("hold without add_holder", 'event = "hold", dest = "=", guards = [], effects = ["add_holder"]',
           'event = "hold", dest = "=", guards = [], effects = []', "references_counted", SMALL),
    Broken("drop a block keeping its references", BLOCK_DROP,
           'guards = ["no_children", "not_chain_tail", "no_point"], effects = [', "references_counted", SMALL),
    Broken("block drop keeps its row", '"drop_references", "free_row", "bump_version"',
           '"drop_references", "bump_version"', "no_slot_leak", SMALL),
    Broken("evict a referenced page", EVICT, 'event = "evict", dest = "FREE", guards = ["unpinned"]',
           "referenced_objects_indexable", SMALL),
    Broken("free the block of a referenced page", EVICT, 'event = "evict", dest = "FREE", guards = ["unpinned"]',
           "freed_blocks_unreachable", SMALL),
    Broken("drop a block under a kept point", BLOCK_DROP,
           'guards = ["no_children", "not_chain_tail"], effects = ["drop_references", ', "index_closed", SMALL),
    Broken("keep a point without its block", 'event = "keep", dest = "KEPT", guards = ["block_indexed"]',
           'event = "keep", dest = "KEPT", guards = []', "index_closed", SMALL),
    Broken("drop a parent block", BLOCK_DROP,
           'guards = ["not_chain_tail", "no_point"], effects = ["drop_references", ', "index_closed", CHAIN),
    Broken("index a block before its parent", 'event = "index", dest = "INDEXED", guards = ["parent_indexed"]',
           'event = "index", dest = "INDEXED", guards = []', "index_closed", ROOTS),
    Broken("a block refers to the recurrent snapshot", 'block = ["compressed_kv", "indexer_state"]',
           'block = ["compressed_kv", "indexer_state", "recurrent_state"]', "snapshots_unshared", SMALL),
    Broken("a block refers to the compressor tail", 'block = ["compressed_kv", "indexer_state"]',
           'block = ["compressed_kv", "indexer_state", "compressor_tail"]', "snapshots_unshared", SMALL),
    Broken("drop a live chain's tail", BLOCK_DROP,
           'guards = ["no_children", "no_point"], effects = ["drop_references", ', "live_chains_indexed", SMALL),
    # slots reserved ahead of the known tokens
    Broken("publish a slot reserved ahead", VERIFY, VERIFY + '\n  { source = "AHEAD", event = "publish", '
           'dest = "PUBLISHED", guards = ["is_owner", "rows_full"], effects = ["clear_owner", "freeze_content"] },',
           "ahead_never_published", attrs.evolve(DEEP, device_kinds=("compressed_kv", "recurrent_state"))),
    Broken("verify before the tokens are known", VERIFY, VERIFY.replace(', "tokens_known"', ""),
           "ahead_never_published", SMALL),
    Broken("seal a slot reserved ahead", VERIFY, VERIFY + '\n  { source = "AHEAD", event = "seal", dest = "READY", '
           'guards = ["is_owner", "has_rows"], effects = ["seal_rows"] },', "ahead_never_published", SMALL),
]


@functools.cache
def _clean(config: CheckConfig) -> CheckResult:
    return check(load_lifecycle(), config)


@pytest.mark.parametrize("broken", BROKEN, ids=[b.name for b in BROKEN])
def test_broken_spec_variant_is_caught_with_a_trace(tmp_path: Path, broken: Broken) -> None:
    assert _clean(broken.config).violations == (), "the unbroken spec must pass the same bound"
    path = mutated_spec(tmp_path, broken.old, broken.new, broken.count)
    result = check(load_lifecycle(path), attrs.evolve(broken.config, stop_on_violation=broken.first))
    found = {v.invariant: v for v in result.violations}
    assert broken.invariant in found, (broken.name, sorted(found))
    assert found[broken.invariant].trace, "a violation comes with the trace that reaches it"


def test_broken_evict_trace_is_shortest_and_ends_with_the_evict(tmp_path: Path) -> None:
    path = mutated_spec(tmp_path, EVICT, 'event = "evict", dest = "FREE", guards = ["unheld"]')
    result = check(load_lifecycle(path), SMALL)
    trace = {v.invariant: v for v in result.violations}["pinned_never_freed"].trace
    # stage five kinds (reserve, write, write_done each), index the block before anything is
    # published (it holds nothing yet), publish and pin atomically, evict the unheld pinned page
    assert len(trace) == 5 * 3 + 3
    assert trace[-3] == "index(p0.block)"
    assert trace[-2].startswith("publish_pinned(p0.*") and trace[-1].startswith("evict(p0.compressed_kv")


def test_reference_drop_is_all_or_nothing(tmp_path: Path) -> None:
    """With `unhold` gone from one referenced kind, no entry holding it can ever be dropped."""
    path = mutated_spec(tmp_path, '{ source = "PUBLISHED", event = "unhold", dest = "=", guards = ["held"], '
                        'effects = ["drop_holder"] },', "")
    explorer = Explorer(load_lifecycle(path), SMALL)
    seed = seed_worlds(explorer, Parents())[-2]  # the last published seed
    labels = {head for (head, _), _ in explorer.successors(seed)}
    assert "drop(p0.resume_point" in labels and "drop(p0.block" not in labels


def _take_slot_kept_free(topo, move, s, actor):
    """take_slot that leaves the block on the free list: the next reservation, of any kind, takes it too."""
    slot = (move.free_slots & -move.free_slots).bit_length() - 1
    return effects_module._edit(move, s, slot=slot)


# Broken effects: mistakes in the bookkeeping code rather than in the spec (the spec names the effect; what the
# effect does is code).  Each: (name, effect name, broken implementation, the invariant it must break).
BROKEN_EFFECTS = [
    ("hand one block to two kinds", "take_slot", _take_slot_kept_free, "blocks_exclusive"),
]


@pytest.mark.parametrize(("name", "effect", "broken", "invariant"), BROKEN_EFFECTS, ids=[b[0] for b in BROKEN_EFFECTS])
def test_broken_effect_is_caught_with_a_trace(monkeypatch: pytest.MonkeyPatch, name, effect, broken,
                                              invariant) -> None:
    config = attrs.evolve(SMALL, device_kinds=("compressed_kv", "swa_window"))  # two kinds share the space
    assert _clean(config).violations == ()
    monkeypatch.setattr(effects_module, "EFFECTS", MappingProxyType({**EFFECTS, effect: broken}))
    result = check(load_lifecycle(), attrs.evolve(config, stop_on_violation=True))
    found = {v.invariant: v for v in result.violations}
    assert invariant in found, (name, sorted(found))
    assert found[invariant].trace


def test_every_invariant_is_shown_able_to_fail() -> None:
    shown = {b.invariant for b in BROKEN} | {b[3] for b in BROKEN_EFFECTS}
    assert shown == INVARIANT_NAMES


def test_device_kinds_names_kinds_of_the_spec() -> None:
    """CheckConfig.device_kinds narrows the world to some kinds; a kind the spec lacks (or a repeat) is refused."""
    spec = load_lifecycle()
    narrow = Explorer(spec, attrs.evolve(SMALL, device_kinds=("recurrent_state", "compressed_kv"))).topo
    assert narrow.device_kinds == ("compressed_kv", "recurrent_state")  # in the spec's order
    for bad in (("compressed_kv", "block"), ("window",), ("compressed_kv", "compressed_kv")):
        with pytest.raises(InvalidArgument) as info:
            Explorer(spec, attrs.evolve(SMALL, device_kinds=bad))
        assert info.value.argument == "device_kinds"
