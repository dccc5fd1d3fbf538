"""The checker's GuardView: answers guard questions about one segment of a world."""

from __future__ import annotations

from hkv_core.checker.world import Topology, World


class WorldView:
    """GuardView over segment `seg` of `world`, with `actor` acting (-1: nobody)."""

    __slots__ = ("topo", "world", "seg", "actor")

    def __init__(self, topo: Topology, world: World, seg: int, actor: int) -> None:
        self.topo, self.world, self.seg, self.actor = topo, world, seg, actor

    def _kind(self) -> str:
        return self.topo.seg_kind[self.seg]

    def slot_available(self) -> bool:
        return self.world.free_slots != 0

    def is_owner(self) -> bool:
        return self.actor >= 0 and self.world.segs[self.seg].owner == self.actor

    def rows_full(self) -> bool:
        return self.world.segs[self.seg].rows >= self.topo.config.rows_per_segment

    def leased_by_actor(self) -> bool:
        return self.actor >= 0 and bool(self.world.segs[self.seg].leases >> self.actor & 1)

    def lease_count(self) -> int:
        return self.world.segs[self.seg].leases.bit_count()

    def copy_pinned(self) -> bool:
        return self.world.segs[self.seg].copy == 1

    def disk_record_durable(self) -> bool:
        record = self.topo.record_of_prefix[self.topo.seg_prefix[self.seg]]
        seg = self.world.segs[record]
        return seg.state in self.topo.durable[self.topo.seg_kind[record]] and not seg.quarantined

    def source_set_complete(self) -> bool:
        prefix = self.topo.seg_prefix[self.seg]
        topo, segs = self.topo, self.world.segs
        return all(segs[s].state in topo.readable[topo.seg_kind[s]]
                   for s in topo.device_of_prefix[prefix])

    def disk_dependents(self) -> int:
        prefix = self.topo.seg_prefix[self.seg]
        topo, segs = self.topo, self.world.segs
        return sum(segs[s].state in topo.disk_held[topo.seg_kind[s]]
                   for s in topo.device_of_prefix[prefix])
