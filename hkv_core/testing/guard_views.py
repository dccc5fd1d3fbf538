"""A GuardView whose answers are set directly (for lockstep and table tests)."""

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
    durable: bool = True
    source_complete: bool = True
    dependents: int = 0

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

    def disk_record_durable(self) -> bool:
        return self.durable

    def source_set_complete(self) -> bool:
        return self.source_complete

    def disk_dependents(self) -> int:
        return self.dependents
