"""The checker's GuardView: answers guard questions about one segment of a world.

The view reads a `World` or a `Move` in progress (a reference event fired by
an index entry's effect is guarded on the world as the move left it so far).
Index questions are about the segment's prefix p: its block (parent: block
p - 1, child: block p + 1) and its resume point.
"""

from __future__ import annotations

from hkv_core.checker.world import Topology, WorldLike


class WorldView:
    """GuardView over segment `seg` of `world`, with `actor` acting (-1: nobody)."""

    __slots__ = ("topo", "world", "seg", "actor")

    def __init__(self, topo: Topology, world: WorldLike, seg: int, actor: int) -> None:
        self.topo, self.world, self.seg, self.actor = topo, world, seg, actor

    def _prefix(self) -> int:
        return self.topo.seg_prefix[self.seg]

    def _block_indexed_at(self, prefix: int) -> bool:
        """Is the block of `prefix` INDEXED (False past the last prefix)."""
        topo = self.topo
        if not 0 <= prefix < topo.config.prefixes:
            return False
        return self.world.segs[topo.block_of_prefix[prefix]].state == topo.block_indexed

    def slot_available(self) -> bool:
        return self.world.free_slots != 0

    def is_owner(self) -> bool:
        return self.actor >= 0 and self.world.segs[self.seg].owner == self.actor

    def rows_full(self) -> bool:
        seg = self.world.segs[self.seg]
        return seg.rows >= self.topo.cap(seg)

    def rows_written(self) -> int:
        return self.world.segs[self.seg].rows

    def leased_by_actor(self) -> bool:
        return self.actor >= 0 and bool(self.world.segs[self.seg].leases >> self.actor & 1)

    def lease_count(self) -> int:
        return self.world.segs[self.seg].leases.bit_count()

    def copy_pinned(self) -> bool:
        return self.world.segs[self.seg].copy == 1

    def holders(self) -> int:
        return self.world.segs[self.seg].holders

    def targets_filling(self) -> bool:
        """Every device object of the tier load's prefix is FILLING for the acting request."""
        topo, segs = self.topo, self.world.segs
        return self.actor >= 0 and all(topo.filling[s][segs[s].state] and segs[s].owner == self.actor
                                       for s in topo.device_of_prefix[self._prefix()])

    def loads_in_flight(self) -> int:
        """1 while the tier load of this object's prefix is LOADING (it writes the object), else 0."""
        load = self.topo.load_of_prefix[self._prefix()]
        return int(self.topo.loading[load][self.world.segs[load].state])

    def parent_indexed(self) -> bool:
        """A root block (prefix 0) has no parent; block p's parent is block p - 1."""
        prefix = self._prefix()
        return prefix == 0 or self._block_indexed_at(prefix - 1)

    def children(self) -> int:
        """INDEXED blocks whose parent is this prefix's block: block p + 1 only (a chain)."""
        return int(self._block_indexed_at(self._prefix() + 1))

    def chain_tail(self) -> bool:
        """Some live request's chain ends at this prefix's block (its lease is on this prefix)."""
        prefix = self._prefix()
        return any(req.lease_prefix == prefix for req in self.world.reqs)

    def has_point(self) -> bool:
        topo = self.topo
        return self.world.segs[topo.point_of_prefix[self._prefix()]].state == topo.point_kept

    def block_indexed(self) -> bool:
        return self._block_indexed_at(self._prefix())

    def tokens_known(self) -> bool:
        """Its owner learnt the tokens it was reserved ahead for (the explorer's append_tokens cleared it)."""
        return not self.world.segs[self.seg].unknown
