"""The registry of names a spec may use: guards, effects and invariants.

A spec naming anything outside these sets is rejected by the loader.  Each
name has exactly one implementation per subject, and tests prove that the
implementations and these sets agree:

- guards: `hkv_core.spec.guards.GUARDS` (pure predicates over a GuardView);
- effects: the model checker's `hkv_core.checker.effects.EFFECTS`;
- invariants: the model checker's `hkv_core.checker.invariants.INVARIANTS`.
"""

from __future__ import annotations

GUARD_NAMES: frozenset[str] = frozenset(
    {
        "slot_available",  # a device slot of the kind's pool is free
        "is_owner",  # the acting request owns this private segment
        "rows_full",  # every row of the segment has been written
        "rows_not_full",  # at least one row is still unwritten
        "leased_by_actor",  # the acting request holds a lease on it
        "not_leased_by_actor",  # the acting request holds no lease on it yet
        "unpinned",  # no lease and no in-flight copy holds it
        "disk_record_durable",  # its prefix has a DURABLE (or READING) disk record
        "source_set_complete",  # every device kind of the prefix is readable
        "no_disk_dependents",  # no segment is ON_DISK or LOADING from this record
    }
)

EFFECT_NAMES: frozenset[str] = frozenset(
    {
        "take_slot",  # take the lowest free device slot
        "free_slot",  # return the device slot
        "set_owner",  # the acting request owns the segment
        "clear_owner",  # nobody owns it (published or freed)
        "append_row",  # write one more row
        "clear_rows",  # forget the content
        "freeze_content",  # remember the content that must not change now
        "add_lease",  # the acting request pins it
        "drop_lease",  # the acting request unpins it
        "pin_copy",  # an in-flight copy pins it
        "unpin_copy",  # the copy completed
        "bump_version",  # the slot's content identity changed: leases on it are stale
        "quarantine",  # a checksum mismatch marks the record unusable
    }
)

INVARIANT_NAMES: frozenset[str] = frozenset(
    {
        "copy_endpoints_pinned",
        "pinned_never_freed",
        "lease_versions_current",
        "lease_covers_object_set",
        "draft_isolation",
        "publish_only_when_complete",
        "immutable_when_frozen",
        "slot_single_owner",
        "no_slot_leak",
        "refcount_matches_leases",
        "disk_copy_durable",
    }
)
