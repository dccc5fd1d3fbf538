"""The manager's state: pools, prefix index (key table + block arena), live requests.

Functions in hit.py, alloc.py, commit.py, evict.py and release.py operate on
a Core; CacheManager (manager.py) is the locked public facade over them.
"""

from __future__ import annotations

import copy
import math

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.block_keys import BlockHasher, ExtraKeys
from hkv_core.errors import ConfigError
from hkv_core.layout import Layout
from hkv_core.manager.arena import BlockArena
from hkv_core.manager.config import ManagerConfig
from hkv_core.manager.id_list import IdList, appended
from hkv_core.manager.key_table import KeyTable
from hkv_core.manager.pools import ROLE_OF, PagePool, PoolInfo, PoolRole
from hkv_core.spec import compile_lifecycle, load_lifecycle


@attrs.define(kw_only=True)
class RequestState:
    """One request in flight: its tokens, keys, position, pages and pins."""

    rid: int
    tokens: NDArray[np.int64]
    keys: NDArray[np.uint64]
    extra: ExtraKeys
    prompt_tokens: int
    computed: int = 0
    allocated: int = 0
    chain: IdList = attrs.field(factory=IdList)  # arena ids of blocks 0.. in the index
    hit_tokens: int = 0
    matched: bool = False
    acquired: bool = False
    pinned_versions: list[dict[int, int]] = attrs.field(factory=list)  # per pool: pinned page -> version
    hit_pages: dict[int, NDArray[np.int32]] = attrs.field(factory=dict)  # per pool: pages of its hit
    tables: list[IdList] = attrs.field(factory=list)  # per pool: prefix page / window block / tail
    owned: list[set[int]] = attrs.field(factory=list)  # per pool: pages it owns (unpublished)
    snapshots: dict[int, list[int]] = attrs.field(factory=dict)  # boundary -> page per tail pool
    window_floor: dict[int, int] = attrs.field(factory=dict)  # per window pool: blocks below are dropped
    token_room: NDArray[np.int64] | None = None  # `tokens` is a prefix view of it while decoding
    key_room: NDArray[np.uint64] | None = None  # `keys` likewise

    def extend(self, tokens: NDArray[np.int64], keys: NDArray[np.uint64]) -> None:
        """Append decoded tokens and their new block keys in amortized O(new) (no copy of the context)."""
        self.tokens, self.token_room = appended(self.tokens, self.token_room, tokens)
        self.keys, self.key_room = appended(self.keys, self.key_room, keys)


class Core:
    """All manager state; no locking here (the facade locks)."""

    def __init__(self, layout: Layout, config: ManagerConfig) -> None:
        self.layout, self.config = layout, config
        self.block_tokens = layout.block_tokens
        self.spec = load_lifecycle()
        tables = compile_lifecycle(self.spec)
        self.infos = tuple(_pool_info(i, p, config, layout.block_tokens) for i, p in enumerate(layout.pools))
        self.pools = tuple(PagePool(info, tables[info.kind]) for info in self.infos)
        self.by_role = {role: [i.index for i in self.infos if i.role is role] for role in PoolRole}
        self.column = {idx: col for role in PoolRole for col, idx in enumerate(self.by_role[role])}
        self.pool_index = {info.name: info.index for info in self.infos}
        self.window_tokens = {i.index: _window_of(layout, i) for i in self.infos}
        self.arena = BlockArena(*(len(self.by_role[r]) for r in PoolRole))
        self.keys = KeyTable(self.arena)  # ids only; keys are read from arena.key
        self.hasher = BlockHasher(block_tokens=layout.block_tokens, seed=config.seed)
        self.requests: dict[int, RequestState] = {}
        self.next_rid = 0
        page_tokens = [self.infos[i].spec.tokens_per_page for i in self.by_role[PoolRole.PREFIX]]
        self.lcm_tokens = math.lcm(layout.block_tokens, *page_tokens)
        self.stats: dict[str, int] = {"evicted_blocks": 0, "evicted_points": 0, "copies": 0}

    def request(self, rid: int) -> RequestState:
        return self.requests[rid]

    def needs_points(self) -> bool:
        """True when resume points carry objects (windows or tails) beyond the prefix pages."""
        return bool(self.by_role[PoolRole.WINDOW] or self.by_role[PoolRole.TAIL])

    def window_first_block(self, pool: int, boundary_tokens: int) -> int:
        """First block whose window rows a resume point at `boundary_tokens` needs."""
        window = self.window_tokens[pool]
        return max(0, boundary_tokens - window + 1) // self.block_tokens

    def widest_window_first_block(self, boundary_tokens: int) -> int:
        pools = self.by_role[PoolRole.WINDOW]
        if not pools:
            return boundary_tokens // self.block_tokens
        return min(self.window_first_block(p, boundary_tokens) for p in pools)


def _pool_info(index: int, spec_pool: object, config: ManagerConfig, block_tokens: int) -> PoolInfo:
    from hkv_core.layout import PoolSpec

    assert isinstance(spec_pool, PoolSpec)
    role = ROLE_OF[(spec_pool.object_kind, spec_pool.entry_kind)]
    pages = config.pool_pages.get(spec_pool.name, config.default_pool_pages) + 1
    tokens = spec_pool.tokens_per_page
    if role is PoolRole.PREFIX and tokens % block_tokens:
        raise ConfigError(f"tokens per page {tokens} is not a multiple of block_tokens {block_tokens}",
                          source=spec_pool.name, key="tokens_per_page")
    if role is PoolRole.WINDOW and tokens != block_tokens:
        raise ConfigError(f"window pages must hold one block ({block_tokens} rows), not {tokens}",
                          source=spec_pool.name, key="tokens_per_page")
    return PoolInfo(index=index, spec=spec_pool, role=role, pages=pages)


def _window_of(layout: Layout, info: PoolInfo) -> int:
    return layout.group(info.spec.group_name).window_tokens


def clone_core(core: Core) -> Core:
    """An independent copy of every mutable part (immutable spec, layout and hasher are shared)."""
    twin = copy.copy(core)
    twin.pools = tuple(_clone_pool(p) for p in core.pools)
    twin.arena = copy.copy(core.arena)
    for name in ARENA_COLUMNS:
        setattr(twin.arena, name, getattr(core.arena, name).copy())
    twin.arena.free = list(core.arena.free)
    twin.keys = core.keys.clone(twin.arena)
    twin.requests = {rid: _clone_request(r) for rid, r in core.requests.items()}
    twin.stats = dict(core.stats)
    return twin


ARENA_COLUMNS = ("key", "parent", "position", "children", "lru_pos", "alive", "point", "prefix_pages",
                 "window_pages", "tail_pages", "lru_block")


def _clone_request(req: RequestState) -> RequestState:
    """Token and key arrays are copied: decoding appends in place into their room."""
    return attrs.evolve(req, tokens=req.tokens.copy(), keys=req.keys.copy(), token_room=None, key_room=None,
                        chain=req.chain.copy(), pinned_versions=[dict(d) for d in req.pinned_versions],
                        hit_pages=dict(req.hit_pages), tables=[t.copy() for t in req.tables],
                        owned=[set(o) for o in req.owned], snapshots={b: list(p) for b, p in req.snapshots.items()},
                        window_floor=dict(req.window_floor))


def _clone_pool(pool: PagePool) -> PagePool:
    twin = copy.copy(pool)
    for name in ("state", "version", "leases", "copies", "holders", "owner", "frozen"):
        setattr(twin, name, getattr(pool, name).copy())
    twin.free = list(pool.free)
    return twin
