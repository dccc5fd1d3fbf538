"""Core: the owners of a manager's state, built once from a layout and a config.

- `pools`: one PagePool per page pool (objects, slots, lifecycle);
- `index`: the PrefixIndex (keys, blocks, resume points, eviction order);
- `roles`: the role objects (prefix, window, tail) over the pools;
- `requests`: the RequestTable;
- `plans`: copy plans issued and not yet completed.
The verbs (match.py, acquire.py, allocate.py, commit.py, release.py,
evict.py) orchestrate these owners; CacheManager (manager.py) is the locked
public facade.  `clone()` copies every mutable part (the implementation-level
model checker explores manager states by cloning).
"""

from __future__ import annotations

import math

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.block_keys import BlockHasher
from hkv_core.layout import Layout
from hkv_core.manager.config import ManagerConfig
from hkv_core.manager.index import PrefixIndex
from hkv_core.manager.lanes import PoolRole, build_lanes
from hkv_core.manager.limits import Limits
from hkv_core.manager.page_pool import PagePool
from hkv_core.manager.requests import RequestTable
from hkv_core.manager.roles import Role, Shared, build_roles, point_columns, pools_of
from hkv_core.spec import compile_lifecycle, load_lifecycle
from hkv_core.spec.records import LifecycleSpec
from hkv_core.spec.table import KindTable

Index = NDArray[np.intp]


@attrs.define
class PlanRecord:
    """A copy plan in flight: its request and the objects it fills (FILLING until completed)."""

    request_id: int
    fills: list[tuple[int, Index]]  # (page pool index, objects)


class Core:
    """All manager state; no locking here (the facade locks)."""

    def __init__(self, layout: Layout, config: ManagerConfig, spec: LifecycleSpec | None = None) -> None:
        self.layout, self.config = layout, config
        self.block_tokens = layout.block_tokens
        self.spec = spec or load_lifecycle()
        self.tables: dict[str, KindTable] = compile_lifecycle(self.spec)
        lanes = build_lanes(layout, config)
        self.limits = Limits.of(layout, config, lanes)
        self.requests = RequestTable(config.max_requests)
        self.pools = tuple(PagePool(lane, self.tables[lane.kind], self.requests) for lane in lanes)
        self.member = {m.name: pool for pool in self.pools for m in pool.spec.members}
        self.index = PrefixIndex(self.tables, self.limits, list(pools_of(self.pools, PoolRole.PREFIX)),
                                 point_columns(self.pools, layout.block_tokens), self.requests)
        self._bind_roles()
        self.hasher = BlockHasher(block_tokens=layout.block_tokens, seed=config.seed)
        self.plans: dict[int, PlanRecord] = {}
        self.next_plan = 0
        self.stats: dict[str, int] = {"evicted_blocks": 0, "evicted_points": 0, "copies": 0, "evictions": 0}

    def _bind_roles(self) -> None:
        self.shared = Shared(index=self.index, requests=self.requests, layout=self.layout, config=self.config)
        self.roles: tuple[Role, ...] = build_roles(self.shared, self.pools)
        self.needs_points = bool(self.index.points.refs)  # windows or tails: hits resume only at kept points
        prefix_tokens = [p.spec.tokens_per_page for p in pools_of(self.pools, PoolRole.PREFIX)]
        self.lcm_tokens = math.lcm(self.block_tokens, *prefix_tokens)

    def clone(self) -> Core:
        """An independent copy of every mutable part (spec, tables, layout and hasher are shared)."""
        twin = Core.__new__(Core)
        twin.__dict__.update(self.__dict__)
        twin.requests = self.requests.clone()
        twin.pools = tuple(p.clone(twin.requests) for p in self.pools)
        twin.member = {name: twin.pools[pool.spec.index] for name, pool in self.member.items()}
        twin.index = self.index.clone({p.spec.index: p for p in twin.pools}, twin.requests)
        twin._bind_roles()
        twin.plans = {k: attrs.evolve(v, fills=list(v.fills)) for k, v in self.plans.items()}
        twin.stats = dict(self.stats)
        return twin
