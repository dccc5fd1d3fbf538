"""PointTable: the retained resume points of the prefix index, one row each.

A resume point sits at the end of a block (`block`) and
refers to the objects a hit there reads besides the prefix pages: for each
window page pool the window pages of the blocks overlapping [P - W + 1, P)
(right-aligned in a row of `width` objects, NULL_OBJECT-padded on the left),
for each tail page pool its compressor-tail snapshot (width 1).  A point is
kept only with every one of them published, and holds one reference on each.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.index.blocks import NO_POINT, BlockTable
from hkv_core.manager.index.entries import EntryTable
from hkv_core.manager.page_pools import PagePools, PoolSlots
from hkv_core.spec.names import Event
from hkv_core.spec.table import KindTable

Index = NDArray[np.intp]


class PointTable(EntryTable):
    """Rows of kind `resume_point`; `refs` holds one column per window or tail page pool."""

    FIRES = (Event.KEEP, Event.DROP)

    def __init__(self, table: KindTable, capacity: int, objects: PagePools, pools: list[tuple[PoolSlots, int]],
                 blocks: BlockTable) -> None:
        super().__init__(table, capacity, objects, pools,
                         sole=frozenset(c for c, (_, width) in enumerate(pools) if width == 1))
        self.blocks = blocks
        self.block = np.full(capacity, -1, np.int32)
        # where requests resume: a prompt's end, a junction, a hit taken; eviction takes the others first
        self.anchor = np.zeros(capacity, np.bool_)
        self.evicting = np.zeros(capacity, np.bool_)  # scratch of the eviction planner: points it planned

    def view(self, rows: Index) -> PointView:
        return PointView(self, rows)

    def objects(self, rows: NDArray[np.integer], col: int) -> NDArray[np.int32]:
        """The objects column `col` lists for `rows`, shape (len(rows), width)."""
        found: NDArray[np.int32] = self.refs[col][1][rows]
        return found

    def keep(self, blocks: NDArray[np.integer], objects: list[NDArray[np.int32]],
             holds: dict[int, tuple[Index, Index | None]] | None = None,
             anchors: NDArray[np.bool_] | None = None) -> Index:
        """Keep a point at the end of each of `blocks`, referring to `objects` (one matrix per column);
        `holds`: per column, the distinct objects and how often the points list each, when known; `anchors`:
        which are where requests resume (a prompt's end, a junction)."""
        rows = self.peek_rows(len(blocks))
        self.block[rows] = blocks
        self.anchor[rows] = False if anchors is None else anchors
        for (_, column), objs in zip(self.refs, objects, strict=True):
            column[rows] = objs
        self.pending.update(holds or {})
        try:
            self.step(rows, Event.KEEP)
        finally:
            self.pending.clear()
        self.blocks.point[blocks] = rows
        return rows

    def drop(self, rows: Index) -> None:
        self.step(rows, Event.DROP)
        self.blocks.point[self.block[rows]] = NO_POINT
        self.block[rows] = -1
        self.anchor[rows] = False


class PointView:
    """GuardView of a step over points `rows`."""

    __slots__ = ("points", "rows")

    def __init__(self, points: PointTable, rows: Index) -> None:
        self.points, self.rows = points, rows

    def block_indexed(self) -> NDArray[np.bool_]:
        blocks = self.points.blocks
        return np.asarray(blocks.state[self.points.block[self.rows]] == blocks.s_indexed)

    def _not_asked(self) -> bool:
        raise AssertionError("a question about device objects or blocks asked of resume points")

    slot_available = is_owner = rows_full = leased_by_actor = lease_count = copy_pinned = _not_asked
    targets_filling = loads_in_flight = holders = rows_written = _not_asked
    parent_indexed = children = chain_tail = has_point = tokens_known = _not_asked
