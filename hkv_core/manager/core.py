"""Core: the owners of a manager's state, built once from a layout and a config.

- `objects`: the PagePools (every page pool's objects, slots and lifecycle); `pools` its per-pool slots;
- `index`: the PrefixIndex (keys, blocks, resume points, eviction order);
- `roles`: the role objects (prefix, window, tail) over the pools;
- `requests`: the RequestTable;
- `plans`: copy plans issued and not yet completed;
- `loads`: the tier loads in flight (tier_loads.py), each a record a load plan copies.
The verbs (match.py, acquire.py, allocate.py, commit.py, release.py,
evict.py) orchestrate these owners; CacheManager (manager.py) is the locked
public facade.  `clone()` copies every mutable part (the implementation-level
model checker explores manager states by cloning).
"""

from __future__ import annotations

import functools
import math

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.block_keys import BlockHasher
from hkv_core.errors import SpecError
from hkv_core.layout import Layout
from hkv_core.manager import footprint
from hkv_core.manager.config import ManagerConfig
from hkv_core.manager.index import EventLog, PrefixIndex
from hkv_core.manager.index.eviction import PolicyFactory, build_policy
from hkv_core.manager.lanes import build_lanes
from hkv_core.manager.limits import Limits
from hkv_core.manager.page_pools import PagePools
from hkv_core.manager.records import Reason
from hkv_core.manager.requests import RequestTable
from hkv_core.manager.roles import Role, Shared, block_columns, build_roles, events_fired, point_columns
from hkv_core.manager.tier_loads import KIND as TIER_LOAD
from hkv_core.manager.tier_loads import TierLoads
from hkv_core.spec import compile_lifecycle, load_lifecycle
from hkv_core.spec.records import LifecycleSpec
from hkv_core.spec.table import KindTable

Index = NDArray[np.intp]


@attrs.define
class PlanRecord:
    """A copy plan in flight: its request and the objects it fills (FILLING until completed)."""

    request_id: int
    fills: Index  # the objects the copies write
    load: bool = False  # a tier load (record_plans.py): a failed one leaves rows the engine recomputes


class Core:
    """All manager state; no locking here (the facade locks)."""

    def __init__(self, layout: Layout, config: ManagerConfig, spec: LifecycleSpec | None = None,
                 eviction_policy: PolicyFactory | None = None) -> None:
        self.layout, self.config = layout, config
        self.block_tokens = layout.block_tokens
        self.spec = spec or load_lifecycle()
        self.tables: dict[str, KindTable] = compile_lifecycle(self.spec)
        lanes = build_lanes(layout, config)
        self.limits = Limits.of(layout, config, lanes)
        self.metadata = footprint.checked(layout, config, lanes, self.limits)  # MetadataTooLarge before any table
        self.requests = RequestTable(config.max_requests)
        self.objects = PagePools(lanes, self.tables, self.requests, events_fired(lanes),
                                 shared_space=config.shared_pages is not None)
        self.pools = self.objects.pools
        self.member = {m.name: pool for pool in self.pools for m in pool.spec.members}
        log = EventLog(config.max_pending_events, layout.block_tokens) if config.kv_events else None
        self.index = PrefixIndex(self.tables, self.limits, self.objects, block_columns(self.pools),
                                 point_columns(self.pools), self.requests, log,
                                 eviction_policy or functools.partial(build_policy, config.eviction))
        self._bind_roles()
        self.hasher = BlockHasher(block_tokens=layout.block_tokens, seed=config.key_seed, algorithm=config.block_hash,
                                  namespace=layout.fingerprint())  # keys never meet another layout's
        self.plans: dict[int, PlanRecord] = {}
        if TIER_LOAD not in self.tables:
            raise SpecError(f"the manager needs kind {TIER_LOAD!r} (tier loads)", file=self.spec.source,
                            table="kinds", key=TIER_LOAD)
        self.loads = TierLoads(self.tables[TIER_LOAD], self.objects)
        self.next_plan = 0
        self.stats: dict[str, int] = {"evicted_blocks": 0, "evicted_points": 0, "copies": 0, "evictions": 0}
        self.hit_rejections: tuple[Reason, ...] | None = None  # match's layers 2 and 4 (static: computed once)

    def _bind_roles(self) -> None:
        self.shared = Shared(objects=self.objects, index=self.index, requests=self.requests, layout=self.layout,
                             config=self.config)
        self.roles: tuple[Role, ...] = build_roles(self.shared, self.pools)
        self.needs_points = bool(self.index.points.refs)  # windows or tails: hits resume only at kept points
        self.state_columns = any(p.spec.state_columns for p in self.pools)  # an engine's per-block states
        prefix_tokens = [p.spec.tokens_per_page for p in block_columns(self.pools)]
        self.lcm_tokens = math.lcm(self.block_tokens, *prefix_tokens)
        # a resume point lies on a boundary of every window page (window pages are shared only whole) and of every
        # state column (a column holds the state at its end only; with partial page copies, also inside a column:
        # roles/state.py)
        self.window_lcm_tokens = math.lcm(self.block_tokens, *(
            p.spec.tokens_per_page for p in self.pools
            if p.spec.window_tokens or (p.spec.state_columns and not self.config.allow_partial_page_copy)))

    def clone(self) -> Core:
        """An independent copy of every mutable part (spec, tables, layout and hasher are shared)."""
        twin = Core.__new__(Core)
        twin.__dict__.update(self.__dict__)
        twin.requests = self.requests.clone()
        twin.objects = self.objects.clone(twin.requests)
        twin.pools = twin.objects.pools
        twin.member = {name: twin.pools[pool.index] for name, pool in self.member.items()}
        twin.index = self.index.clone(twin.objects, twin.requests)
        twin._bind_roles()
        twin.plans = dict(self.plans)  # records are never changed in place
        twin.loads = self.loads.clone(twin.objects)
        twin.stats = dict(self.stats)
        return twin
