"""A GuardView whose answers are set directly (for lockstep and table tests).

`permissive()` and `refusing()` answer every question the two opposite ways:
each guard passes on one and refuses on the other (a guard and its negation,
such as `held` / `unheld`, split between them), so a walk over both views
takes every guarded edge both ways.
"""

from __future__ import annotations

import attrs


@attrs.define(kw_only=True)
class FixedView:
    """Every GuardView question answered by a field."""

    slot_free: bool = True
    owner: bool = True
    full: bool = True
    leased_by_me: bool = False
    leases: int = 0
    copying: bool = False
    targets: bool = True  # every object a tier load writes is FILLING for the actor
    loading: int = 0  # tier loads in flight writing the object
    held_by: int = 0  # index references on the object
    rows: int = 1  # rows written
    parent: bool = True  # the block's parent is INDEXED (or it is a root)
    child_count: int = 0  # INDEXED blocks whose parent it is
    tail: bool = False  # a live request's chain ends at the block
    point: bool = False  # a KEPT resume point sits on the block
    block: bool = True  # the resume point's block is INDEXED
    known: bool = True  # the owner knows the tokens the object's first row needs

    def slot_available(self) -> bool:
        return self.slot_free

    def is_owner(self) -> bool:
        return self.owner

    def rows_full(self) -> bool:
        return self.full

    def leased_by_actor(self) -> bool:
        return self.leased_by_me

    def lease_count(self) -> int:
        return self.leases

    def copy_pinned(self) -> bool:
        return self.copying

    def targets_filling(self) -> bool:
        return self.targets

    def loads_in_flight(self) -> int:
        return self.loading

    def holders(self) -> int:
        return self.held_by

    def rows_written(self) -> int:
        return self.rows

    def parent_indexed(self) -> bool:
        return self.parent

    def children(self) -> int:
        return self.child_count

    def chain_tail(self) -> bool:
        return self.tail

    def has_point(self) -> bool:
        return self.point

    def block_indexed(self) -> bool:
        return self.block

    def tokens_known(self) -> bool:
        return self.known


def permissive() -> FixedView:
    """The answers under which every positive guard passes (free slot, owner, unpinned, unheld, indexed ...)."""
    return FixedView()


def refusing() -> FixedView:
    """The opposite answer to every question of `permissive()`."""
    return FixedView(slot_free=False, owner=False, full=False, leased_by_me=True, leases=1, copying=True,
                     targets=False, loading=1, held_by=1, rows=0, parent=False,
                     child_count=1, tail=True, point=True, block=False, known=False)
