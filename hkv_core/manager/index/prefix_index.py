"""PrefixIndex: block keys, the block and resume-point tables, and their eviction order.

The only code that adds or removes blocks and resume points.  It refers to
cached objects by their ids (never by device page), holds one index
reference on each through the lifecycle events of its entries, keeps the
eviction order through an `EvictionPolicy` (exact LRU), and is the one place
that records which blocks and resume points were stored or removed (cache
events, `EventLog`; none are recorded when the manager was built without).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from hkv_core.manager.index.blocks import NO_BLOCK, NO_POINT, Attach, BlockTable
from hkv_core.manager.index.event_log import EventLog
from hkv_core.manager.index.eviction import PolicyFactory
from hkv_core.manager.index.key_table import EMPTY, KeyTable
from hkv_core.manager.index.points import PointTable
from hkv_core.manager.index.policy import EvictionPolicy, LruPolicy
from hkv_core.manager.limits import Limits
from hkv_core.manager.page_pools import PagePools, PoolSlots
from hkv_core.manager.requests import RequestTable
from hkv_core.spec.table import KindTable

Index = NDArray[np.intp]
WALK_BLOCKS = 2048  # a matched chain up to this long is read by parent links, longer ones by key lookups



class PrefixIndex:
    """Blocks (keyed, chained), resume points, eviction order; see the module docstring."""

    def __init__(self, tables: dict[str, KindTable], limits: Limits, objects: PagePools,
                 prefix_pools: list[PoolSlots], point_pools: list[tuple[PoolSlots, int]],
                 requests: RequestTable, log: EventLog | None = None, policy: PolicyFactory | None = None) -> None:
        self.blocks = BlockTable(tables["block"], limits.block_rows, objects, prefix_pools)
        self.points = PointTable(tables["resume_point"], limits.point_rows, objects, point_pools, self.blocks)
        self.keys = KeyTable(self.blocks, limits.key_table_slots)
        self.policy: EvictionPolicy = (policy(limits.block_rows, self.blocks.key) if policy is not None
                                       else LruPolicy(limits.block_rows))
        self.requests = requests
        self.log = log  # cache events (None: not recorded)
        self.hint = 0  # matched's last answer (where its search starts; any value gives the same answers)

    # ------------------------------------------------------------------ lookups

    def matched(self, keys: NDArray[np.uint64]) -> NDArray[np.int32]:
        """Block ids of the longest prefix of `keys` that is indexed.

        Only leaves are ever dropped, so presence along a chain is monotone: a
        binary search over scalar probes finds the longest indexed prefix, and
        its blocks are the last one's ancestors (parent links), no key compared.
        """
        present, absent = 0, len(keys) + 1  # keys[:present] indexed, keys[:absent] not
        last = NO_BLOCK
        find = self.keys.find_row
        hint = self.hint  # the last answer: requests sharing a system prompt stop where the last one did
        if 0 < hint < absent:
            found = find(keys, hint - 1)
            if found == EMPTY:
                absent = hint
            else:
                present, last = hint, found
                if hint < len(keys):
                    found = find(keys, hint)
                    if found == EMPTY:
                        absent = hint + 1
                    else:
                        present, last = hint + 1, found
        while absent - present > 1:
            mid = (present + absent) // 2
            found = find(keys, mid - 1)
            if found == EMPTY:
                absent = mid
            else:
                present, last = mid, found
        self.hint = present
        if present > WALK_BLOCKS:  # a long chain: one vectorized lookup beats a Python walk
            return self.keys.lookup(keys[:present])
        return self.blocks.ancestors(last, present)

    def lookup(self, keys: NDArray[np.uint64]) -> NDArray[np.int32]:
        return self.keys.lookup(keys)

    # ------------------------------------------------------------------ blocks

    def add_chain(self, keys: NDArray[np.uint64], parent: int, tokens: NDArray[np.int64],
                  lora: str | int | None = None) -> Index:
        """Index consecutive new keys under `parent` (rows reserved by the caller); returns their ids.
        `tokens` (the blocks' tokens) and `lora` (the request's adapter) only go into the event log."""
        rows = self.blocks.index_chain(keys, parent)
        self.keys.insert_many(keys, rows)
        self.blocks.reserved -= len(rows)
        if self.log is not None:
            self.log.stored(keys, None if parent == NO_BLOCK else self.blocks.key[parent], tokens, lora)
        return rows

    def attach(self, updates: list[Attach]) -> None:
        self.blocks.attach(updates)

    def drop_blocks(self, ids: Index) -> None:
        """Drop leaf blocks, children first (their keys leave the table before their rows are reused)."""
        if not ids.size:
            return
        self.blocks.tails = self.requests.chain_tails()
        keys = self.blocks.key[ids] if self.log is not None else None  # (a copy: fancy indexing)
        self.blocks.drop(ids)
        self.keys.remove_ids(ids)
        self.policy.forget(ids.astype(np.int32))
        if self.log is not None and keys is not None:
            self.log.removed(keys)

    def touch(self, chain: NDArray[np.integer]) -> None:
        self.policy.touch(chain.astype(np.int32, copy=False))

    def anchor_deepest(self, chain: NDArray[np.integer]) -> None:
        """The deepest point kept on `chain` (a request's, at its release) becomes an anchor."""
        kept = np.flatnonzero(self.blocks.point[chain] != NO_POINT)
        if kept.size:
            self.points.anchor[self.blocks.point[chain[kept[-1]]]] = True

    # ------------------------------------------------------------------ points

    def keep_points(self, blocks: NDArray[np.integer], positions: NDArray[np.integer],
                    objects: list[NDArray[np.int32]],
                    holds: dict[int, tuple[Index, Index | None]] | None = None,
                    anchors: NDArray[np.bool_] | None = None) -> Index:
        """Keep a point at the end of each of `blocks` (at token `positions`, for the event log); `anchors`: which
        are where requests resume (eviction takes them last)."""
        rows = self.points.keep(blocks, objects, holds, anchors)
        self.points.reserved -= len(rows)
        if self.log is not None and len(rows):
            self.log.points_stored(self.blocks.key[blocks], positions)
        return rows

    def drop_points(self, rows: Index) -> None:
        blocks = self.points.block[rows] if self.log is not None else None
        self.points.drop(rows)
        if self.log is not None and blocks is not None and len(rows):
            self.log.points_removed(self.blocks.key[blocks])

    # ------------------------------------------------------------------ rows

    def reserve(self, blocks: int, points: int) -> None:
        assert blocks <= self.blocks.available() and points <= self.points.available()
        self.blocks.reserved += blocks
        self.points.reserved += points

    def unreserve(self, blocks: int, points: int) -> None:
        self.blocks.reserved -= blocks
        self.points.reserved -= points
        assert self.blocks.reserved >= 0 and self.points.reserved >= 0

    def take_unheld(self) -> Index:
        """Objects that lost references since the last call (to settle; distinct)."""
        blocks, points = self.blocks.take_unheld(), self.points.take_unheld()
        return np.concatenate([blocks, points]) if blocks.size and points.size else (blocks if blocks.size else points)

    def nbytes(self) -> dict[str, int]:
        """Bytes of every table of the index (all allocated at construction)."""
        def arrays(owner: object) -> int:
            return sum(v.nbytes for v in vars(owner).values() if isinstance(v, np.ndarray))
        return {"blocks": arrays(self.blocks) + sum(c.nbytes for _, c in self.blocks.refs),
                "points": arrays(self.points) + sum(c.nbytes for _, c in self.points.refs),
                "keys": self.keys.nbytes(), "policy": arrays(self.policy)}

    def clone(self, objects: PagePools, requests: RequestTable) -> PrefixIndex:
        twin = PrefixIndex.__new__(PrefixIndex)
        twin.blocks = BlockTable.__new__(BlockTable)
        self.blocks.clone_into(twin.blocks, objects)
        twin.points = PointTable.__new__(PointTable)
        self.points.clone_into(twin.points, objects)
        twin.points.blocks = twin.blocks
        twin.keys = self.keys.clone(twin.blocks)
        twin.policy = self.policy.clone(twin.blocks)
        twin.requests, twin.log = requests, None if self.log is None else self.log.clone()
        twin.hint = self.hint
        return twin
