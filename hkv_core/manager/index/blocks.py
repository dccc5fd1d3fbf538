"""BlockTable: the blocks of the prefix index, one row per indexed block.

Per row: the block's 128-bit key, its parent block (NO_BLOCK for a root),
the resume point kept at its end (NO_POINT when none), and per prefix page
pool the object covering it (NULL_OBJECT until that object is published).
A block's children are the INDEXED blocks whose parent it is: the `drop`
guard reads them from the parent column (drops are rare, in bulk).  Blocks form a forest of chains; a block is
dropped only as a leaf that ends no live request's chain and has no point
(the guards of `drop`), so a chain loses its tail before its head.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from hkv_core.arrays import all_true
from hkv_core.manager.index.entries import EntryTable
from hkv_core.manager.limits import CHAIN_MEMO_ENTRIES
from hkv_core.manager.page_pools import PagePools, PoolSlots
from hkv_core.spec.names import Event, State
from hkv_core.spec.table import KindTable

NO_BLOCK = -1  # no block: a root's parent, a missing key
NO_POINT = -1  # no resume point: a block that ends none
Index = NDArray[np.intp]
Attach = tuple[int, Index, NDArray[np.integer], Index, Index | None]  # (column, blocks, objects, distinct, counts)


class BlockTable(EntryTable):
    """Rows of kind `block`; `refs` holds one column per prefix page pool."""

    FIRES = (Event.INDEX, Event.ATTACH, Event.DROP)

    def __init__(self, table: KindTable, capacity: int, objects: PagePools, prefix_pools: list[PoolSlots]) -> None:
        super().__init__(table, capacity, objects, [(pool, 1) for pool in prefix_pools], version=np.uint16)
        self.key = np.zeros((capacity, 2), np.uint64)
        self.parent = np.full(capacity, NO_BLOCK, np.int32)
        self.point = np.full(capacity, NO_POINT, np.int32)
        self.s_indexed = table.state_id(State.INDEXED)
        self.tails: NDArray[np.int32] = np.zeros(0, np.int32)  # live chain tails, set by the caller of drop
        self.chains: dict[int, NDArray[np.int32]] = {}  # last block -> its chain (`ancestors`), until a drop
        self.columns = [column[:, 0] for _, column in self.refs]  # 1-D views: a gather by (rows, 0) costs 5x more

    def view(self, rows: Index) -> BlockView:
        return BlockView(self, rows)

    def clone_into(self, twin: EntryTable, objects: PagePools) -> None:
        super().clone_into(twin, objects)
        assert isinstance(twin, BlockTable)
        twin.chains = dict(self.chains)  # its own memo (the arrays are read-only, shared)
        twin.columns = [column[:, 0] for _, column in twin.refs]

    def objects(self, rows: NDArray[np.integer], col: int) -> NDArray[np.int32]:
        """The objects of prefix page pool `col` covering `rows` (NULL_OBJECT where none yet)."""
        found: NDArray[np.int32] = self.columns[col][rows]
        return found

    def index_chain(self, keys: NDArray[np.uint64], parent: int) -> Index:
        """New INDEXED blocks for consecutive keys, each the parent of the next, under `parent`."""
        rows = self.peek_rows(len(keys))
        self.key[rows] = keys
        self.parent[rows[0]] = parent
        self.parent[rows[1:]] = rows[:-1]
        self.step(rows, Event.INDEX, refs=())  # fresh rows refer to nothing yet: their pages attach later
        return rows

    def ancestors(self, last: int, count: int) -> NDArray[np.int32]:
        """The chain of `count` blocks ending at block `last`, root first (parent links), read-only.

        Remembered per last block (the system prompt of many requests ends at
        the same block): an indexed block's ancestors never change, and every
        `drop` forgets every remembered chain.
        """
        known = self.chains.get(last)
        if known is not None and len(known) == count:
            return known
        out = np.empty(count, np.int32)
        parent, block = self.parent, last
        for i in range(count - 1, -1, -1):
            out[i] = block
            block = parent.item(block)
        out.setflags(write=False)
        if len(self.chains) >= CHAIN_MEMO_ENTRIES:
            del self.chains[next(iter(self.chains))]  # the oldest
        self.chains[last] = out
        return out

    def attach(self, updates: list[Attach]) -> None:
        """Blocks now refer to objects of some prefix page pools: one `attach` over every block updated.

        Each update is (column, blocks without an object there, the object of
        each, and the distinct objects with how many of the blocks refer to each).
        """
        updates = [u for u in updates if u[1].size]
        if not updates:
            return
        for col, rows, objs, held, counts in updates:
            column = self.columns[col]
            assert not np.count_nonzero(column[rows]), "a block refers to one object per page pool"
            column[rows] = objs
            self.pending[col] = (held, counts)
        rows = np.concatenate([u[1] for u in updates]) if len(updates) > 1 else updates[0][1]
        try:  # `attach` counts nothing per block, so a block updated in two columns may appear twice
            self.step(rows, Event.ATTACH, refs=tuple(u[0] for u in updates))
        finally:
            self.pending.clear()

    def drop(self, rows: Index) -> None:
        """Drop leaf blocks `rows`, children before parents (each a leaf once the earlier ones are gone)."""
        self.step(rows, Event.DROP)
        self.chains.clear()
        self.point[rows] = NO_POINT
        self.parent[rows] = NO_BLOCK

    def kept_children(self, rows: Index, *, leaving: bool = True) -> NDArray[np.int32]:
        """Per row: its INDEXED children that are not among `rows` (`leaving`; else all of them) (one pass over
        the parent column)."""
        staying = self.state == self.s_indexed
        if leaving:
            staying[rows] = False
        parents = self.parent[staying]
        counts = np.bincount(parents[parents != NO_BLOCK], minlength=self.capacity)
        found: NDArray[np.int32] = counts[rows].astype(np.int32)
        return found


class BlockView:
    """GuardView of a step over blocks `rows` (index: a chain, root first; drop: leaves first)."""

    __slots__ = ("blocks", "rows")

    def __init__(self, blocks: BlockTable, rows: Index) -> None:
        self.blocks, self.rows = blocks, rows

    def parent_indexed(self) -> NDArray[np.bool_]:
        b, rows = self.blocks, self.rows
        parents = b.parent[rows]
        ok = np.empty(len(rows), np.bool_)
        first = int(parents[0])
        ok[0] = first == NO_BLOCK or b.state[first] == b.s_indexed
        np.equal(parents[1:], rows[:-1], out=ok[1:])  # the chain's own earlier blocks are indexed first
        if not all_true(ok):  # a parent off the chain: read its state
            ok |= (parents == NO_BLOCK) | (b.state[np.maximum(parents, 0)] == b.s_indexed)
        return ok

    def children(self) -> NDArray[np.int32]:
        return self.blocks.kept_children(self.rows)

    def chain_tail(self) -> NDArray[np.bool_]:
        return np.isin(self.rows, self.blocks.tails)

    def has_point(self) -> NDArray[np.bool_]:
        return np.asarray(self.blocks.point[self.rows] != NO_POINT)

    def _not_asked(self) -> bool:
        raise AssertionError("a question about device objects asked of blocks")

    slot_available = is_owner = rows_full = leased_by_actor = lease_count = copy_pinned = _not_asked
    targets_filling = loads_in_flight = holders = rows_written = _not_asked
    block_indexed = tokens_known = _not_asked
