"""The lifecycle loader accepts the shipped spec and rejects malformed ones precisely."""

from pathlib import Path

import pytest

from hkv_core.errors import HkvError, SpecError
from hkv_core.spec import load_lifecycle
from hkv_core.spec.names import EFFECT_NAMES, GUARD_NAMES, INVARIANT_NAMES
from hkv_core.testing.spec_mutation import mutated_spec

EVICT = '{ source = "PUBLISHED", event = "evict", dest = "FREE", guards = ["unpinned", "unheld"]'
RESUME_REFS = 'resume_point = ["swa_window", "compressor_tail", "recurrent_state"]'


def test_shipped_spec_loads_with_eight_kinds() -> None:
    spec = load_lifecycle()
    assert list(spec.kinds) == ["compressed_kv", "compressor_tail", "swa_window",
                                "indexer_state", "recurrent_state", "tier_load", "block", "resume_point"]
    assert spec.record_kinds == ("tier_load",)
    assert spec.index_kinds == ("block", "resume_point")
    assert dict(spec.references) == {"block": ("compressed_kv", "indexer_state"),
                                     "resume_point": ("swa_window", "compressor_tail", "recurrent_state")}
    assert spec.snapshot_kinds == {"compressor_tail", "recurrent_state"}
    assert spec.reference_events == {"hold", "unhold"}
    assert spec.lease_events == {"pin", "unpin", "publish_pinned"}
    assert {i.name for i in spec.invariants} == INVARIANT_NAMES
    for kind in spec.kinds.values():
        for t in kind.transitions:
            assert set(t.guards) <= GUARD_NAMES and set(t.effects) <= EFFECT_NAMES


def test_spec_covers_lifecycle_failure_rows() -> None:
    rows = {i.failure for i in load_lifecycle().invariants}
    assert {"F1", "F2", "F3", "F5", "F7", "F8", "F9", "F11", "F17"} <= rows


CASES = [
    # (old, new, table fragment, key, message fragment)
    ('event = "publish", dest = "PUBLISHED"', 'event = "publish", dest = "PUBLISHD"', "transitions[", "dest",
     "unknown state"),
    ('{ source = "FREE", event = "reserve", dest = "RESERVED"',
     '{ source = "FRE", event = "reserve", dest = "RESERVED"', "transitions[", "source", "unknown state"),
    ('event = "write_done", dest = "READY"', 'event = "write", dest = "READY"', "transitions[", "event",
     "duplicate transition"),
    ('guards = ["unpinned"]', 'guards = ["unpined"]', "transitions[", "guards", "not registered"),
    ('effects = ["pin_copy"] }', 'effects = ["pin_cpy"] }', "transitions[", "effects", "not registered"),
    ("[invariants.no_slot_leak]", "[invariants.no_slot_leek]", "invariants.no_slot_leek", "*",
     "not registered"),
    ('states = ["IDLE", "LOADING"]\ntransitions = [', 'states = ["IDLE", "LOADING", "STUCK"]\ntransitions = [\n'
     '  { source = "IDLE", event = "stall", dest = "STUCK", guards = [], effects = [] },', "kinds.tier_load", "final",
     "dead-end state 'STUCK'"),
    ('initial = "IDLE"', 'initial = "NOWHERE"', "kinds.tier_load", "initial", "unknown state"),
    ('states = ["IDLE", "LOADING"]', 'states = ["IDLE", "LIMBO", "LOADING"]', "kinds.tier_load",
     "states", "unreachable"),
    ('failure = "F2"', 'failure = "two"', "invariants.", "failure", "failure row of docs/failures.md"),
    ("[meta]\nversion = 2", "[meta]\nversion = 2\nversoin = 2", "meta", "versoin", "unknown key"),
    ('lease_events = ["pin", "unpin", "publish_pinned"]', 'lease_events = ["pin", "grab", "publish_pinned"]',
     "meta", "lease_events", "unknown name"),
    # the prefix index: its kinds, its events and what each kind refers to
    ('index_kinds = ["block", "resume_point"]', 'index_kinds = ["block", "resume_pont"]', "meta", "index_kinds",
     "unknown name"),
    ('index_kinds = ["block", "resume_point"]', 'index_kinds = ["block", "compressed_kv"]', "meta", "index_kinds",
     "unknown name"),  # a device kind is not an index kind
    ('reference_events = ["hold", "unhold"]', 'reference_events = ["hold", "unhld"]', "meta",
     "reference_events", "unknown name"),
    (RESUME_REFS, RESUME_REFS + '\nchunk = ["swa_window"]', "references", "chunk", "unknown key"),
    ('block = ["compressed_kv", "indexer_state"]', 'block = ["compressed_kv", "tier_load"]', "references",
     "block", "unknown name"),  # a record kind is not a device kind
    ('block = ["compressed_kv", "indexer_state"]', 'block = ["compressed_kv", "resume_point"]', "references",
     "block", "unknown name"),  # nor is an index kind
    (RESUME_REFS, "", "references", "resume_point", "missing required key"),
    # point snapshots: device kinds only
    ('snapshot_kinds = ["compressor_tail", "recurrent_state"]', 'snapshot_kinds = ["compressor_tail", "block"]',
     "meta", "snapshot_kinds", "unknown name"),
    ('snapshot_kinds = ["compressor_tail", "recurrent_state"]', '', "meta", "snapshot_kinds",
     "missing required key"),
]


@pytest.mark.parametrize(("old", "new", "table", "key", "message"), CASES)
def test_malformed_spec_is_rejected_naming_file_table_key(
        tmp_path: Path, old: str, new: str, table: str, key: str, message: str) -> None:
    path = mutated_spec(tmp_path, old, new)
    with pytest.raises(SpecError) as info:
        load_lifecycle(path)
    err = info.value
    assert isinstance(err, HkvError)
    assert err.file == str(path) and table in err.table and err.key == key, err
    assert message in str(err) and str(path) in str(err)


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[kinds\n")
    with pytest.raises(SpecError, match="invalid TOML"):
        load_lifecycle(bad)
    with pytest.raises(SpecError, match="file not found"):
        load_lifecycle(tmp_path / "missing.toml")


def test_final_state_with_exits_is_rejected(tmp_path: Path) -> None:
    path = mutated_spec(tmp_path, 'initial = "IDLE"\nfinal = []', 'initial = "IDLE"\nfinal = ["LOADING"]')
    with pytest.raises(SpecError, match="final state 'LOADING' has outgoing"):
        load_lifecycle(path)


def test_mutation_helper_refuses_a_target_that_is_absent(tmp_path: Path) -> None:
    with pytest.raises(AssertionError):
        mutated_spec(tmp_path, "no such text anywhere", "x")


def test_evict_guard_present_in_shipped_spec() -> None:
    assert EVICT in (Path(load_lifecycle().source)).read_text()


def test_a_spec_file_that_is_no_spec_is_a_spec_error_for_api_callers_too(tmp_path: Path) -> None:
    """What `hkv check --spec` refuses, load_lifecycle refuses: not a regular file, too large, not UTF-8."""
    import os

    from hkv_core.spec.toml_fields import MAX_SPEC_BYTES

    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    big = tmp_path / "big.toml"
    with big.open("wb") as handle:
        handle.truncate(MAX_SPEC_BYTES + 1)  # sparse: nothing is written
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b"[meta]\nname = \"caf\xe9\"\n")
    for path, why in ((fifo, "not a regular file"), (big, "larger than"), (latin, "not UTF-8"),
                      (tmp_path / "missing.toml", "file not found")):
        with pytest.raises(SpecError, match=why) as info:
            load_lifecycle(path)
        assert info.value.file == str(path)
        assert info.value.message.startswith(f"{path}: {why}"), info.value.message  # issue 27: not `[] *:`
    broken = tmp_path / "bad.toml"
    broken.write_text("[[[")
    with pytest.raises(SpecError) as info:
        load_lifecycle(broken)
    assert info.value.message.startswith(f"{broken}: invalid TOML: ")
    assert (info.value.table, info.value.key) == ("", "*")  # the fields still say: the whole file
