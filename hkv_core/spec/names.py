"""The registry of names a spec may use: guards, effects, invariants, and the states and events code names.

A spec naming a guard, effect or invariant outside these sets is rejected by
the loader.  Each name has exactly one implementation per subject, and tests
prove that the implementations and these sets agree:

- guards: `hkv_core.spec.guards.GUARDS` (pure predicates over a GuardView);
- effects: the model checker's `hkv_core.checker.effects.EFFECTS` and the
  manager's (`hkv_core.manager.object_effects.EFFECTS`, `hkv_core.manager.index`);
- invariants: the model checker's `hkv_core.checker.invariants.INVARIANTS` and
  the live manager's `hkv_core.manager.invariants.INVARIANTS`.

`State` and `Event` are the names code uses (never string literals on a hot
path); every owner resolves the ones it fires against the loaded spec once, at
construction (`KindTable.event_id` / `state_id`), so a spec that lacks one is
refused before anything runs.
"""

from __future__ import annotations

from enum import StrEnum

GUARD_NAMES: frozenset[str] = frozenset(
    {
        "slot_available",  # a free slot of the object's pool remains for it
        "is_owner",  # the acting request owns this private object
        "rows_full",  # every row of the object (its size, or its sealed size) has been written
        "rows_not_full",  # at least one row is still unwritten
        "has_rows",  # at least one row has been written
        "leased_by_actor",  # the acting request's lease lists it
        "not_leased_by_actor",  # the acting request's lease does not list it yet
        "unpinned",  # no lease and no in-flight copy holds it
        "held",  # at least one index entry refers to it
        "unheld",  # no index entry refers to it
        "targets_filling",  # every object a tier load writes is FILLING for the acting request
        "no_load_in_flight",  # no tier load in flight writes this object (its copy settles with the load)
        "parent_indexed",  # a block's parent block is INDEXED (or it is a root block)
        "no_children",  # no INDEXED block has this block as its parent
        "not_chain_tail",  # no live request's chain ends at this block
        "no_point",  # no KEPT resume point sits on this block
        "block_indexed",  # a resume point's block is INDEXED
        "tokens_known",  # the owner knows every token the object's first row needs (it is no longer ahead)
    }
)

EFFECT_NAMES: frozenset[str] = frozenset(
    {
        "take_slot",  # take a free device slot (the lowest one)
        "free_slot",  # return the device slot
        "set_owner",  # the acting request owns the object
        "clear_owner",  # nobody owns it (published or freed)
        "append_row",  # write one more row (a copy writes the rows it carries)
        "clear_rows",  # forget the content
        "seal_rows",  # the object's size becomes the rows written so far
        "freeze_content",  # remember the content that must not change now
        "add_lease",  # the acting request pins it
        "drop_lease",  # the acting request unpins it
        "pin_copy",  # an in-flight copy pins it
        "unpin_copy",  # the copy completed
        "bump_version",  # the content identity changed: leases and hits on it are stale
        "add_holder",  # one more index entry refers to it
        "drop_holder",  # one index entry fewer refers to it
        "take_row",  # an index entry takes a row of its table
        "free_row",  # an index entry returns its row
        "hold_references",  # an index entry holds every published object it refers to (fires `hold`)
        "drop_references",  # an index entry releases every object it holds (fires `unhold`)
        "mark_ahead",  # the object holds positions its owner does not know yet: it waits for `verify`
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
        "blocks_exclusive",
        "freed_blocks_unreachable",
        "refcount_matches_leases",
        "tier_loads_pinned",
        "snapshots_unshared",
        "references_counted",
        "referenced_objects_indexable",
        "index_closed",
        "live_chains_indexed",
        "ahead_never_published",
    }
)


class State(StrEnum):
    """Every state the code names (device objects, tier loads, blocks, resume points)."""

    FREE = "FREE"
    AHEAD = "AHEAD"
    RESERVED = "RESERVED"
    FILLING = "FILLING"
    COMPRESSING = "COMPRESSING"
    DRAFT = "DRAFT"
    DRAFT_FILLING = "DRAFT_FILLING"
    READY = "READY"
    PUBLISHED = "PUBLISHED"
    RETIRED = "RETIRED"
    IDLE = "IDLE"
    LOADING = "LOADING"
    INDEXED = "INDEXED"
    KEPT = "KEPT"


class Event(StrEnum):
    """Every event the code fires."""

    RESERVE = "reserve"
    RESERVE_DRAFT = "reserve_draft"
    RESERVE_AHEAD = "reserve_ahead"
    VERIFY = "verify"
    ACCEPT = "accept"
    REJECT = "reject"
    FILL = "fill"
    LOAD = "load"
    COPY_DONE = "copy_done"
    COPY_FAIL = "copy_fail"
    SEAL = "seal"
    WRITE_DONE = "write_done"
    ABORT = "abort"
    PUBLISH = "publish"
    PUBLISH_PINNED = "publish_pinned"
    PIN = "pin"
    UNPIN = "unpin"
    HOLD = "hold"
    UNHOLD = "unhold"
    EVICT = "evict"
    RETIRE = "retire"
    RECLAIM = "reclaim"
    INDEX = "index"
    ATTACH = "attach"
    DROP = "drop"
    KEEP = "keep"
