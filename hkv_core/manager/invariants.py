"""check_invariants(manager): every spec invariant, evaluated on the live structures.

Each function returns a list of messages (empty when the invariant holds).
They are plain functions, not asserts, so `python -O` never strips them;
tests, the implementation-level model check and `ManagerConfig(debug_checks=True)`
call them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Protocol

import numpy as np

from hkv_core.errors import HkvError
from hkv_core.manager.arena import NO_BLOCK
from hkv_core.manager.core import Core
from hkv_core.manager.pools import NULL_PAGE, PoolRole


class HasCore(Protocol):
    """A CacheManager, or anything else that exposes the manager state it wraps."""

    @property
    def core(self) -> Core: ...

Check = Callable[[Core], list[str]]


class InvariantViolation(HkvError):
    """The debug flag found a broken invariant after a manager call."""

    def __init__(self, *, action: str, violations: list[str]) -> None:
        super().__init__(f"after {action}: {'; '.join(violations[:5])}", action=action, violations=violations)


def _states(core: Core, pool: int, names: set[str]) -> np.ndarray:
    """Mask of the pool's pages whose state is one of `names` (a lookup table, no isin)."""
    p = core.pools[pool]
    table = np.zeros(len(p.table.states), np.bool_)
    table[[p.table.state_index[n] for n in names if n in p.table.state_index]] = True
    return table[p.state]


def copy_endpoints_pinned(core: Core) -> list[str]:
    out = []
    for pool, p in enumerate(core.pools):
        copying = _states(core, pool, set(core.spec.copy_states))
        bad = np.flatnonzero(copying != (p.copies > 0))
        out += [f"{core.infos[pool].name} page {b}: copy pins {p.copies[b]} in {p.state_name(int(b))}" for b in bad]
    return out


def pinned_never_freed(core: Core) -> list[str]:
    out = []
    for pool, p in enumerate(core.pools):
        bad = np.flatnonzero(((p.leases > 0) | (p.copies > 0)) & (p.state == p.table.initial))
        out += [f"{core.infos[pool].name} page {b} is pinned but FREE" for b in bad]
    return out


def lease_versions_current(core: Core) -> list[str]:
    out = []
    for req in core.requests.values():
        for pool, pins in enumerate(req.pinned_versions):
            for page, version in pins.items():
                if int(core.pools[pool].version[page]) != version:
                    out.append(f"request {req.rid}: {core.infos[pool].name} page {page} version moved "
                               f"{version} -> {core.pools[pool].version[page]}")
    return out


def lease_covers_object_set(core: Core) -> list[str]:
    """Every page a request reads (its tables) is owned or pinned by it; its chain stays indexed (F11)."""
    out = _chains_indexed(core)
    for req in core.requests.values():
        for pool, table in enumerate(req.tables):
            for page in table:
                if page != NULL_PAGE and page not in req.owned[pool] and page not in req.pinned_versions[pool]:
                    out.append(f"request {req.rid} reads {core.infos[pool].name} page {page} "
                               "without owning or pinning it")
    return out


def _chains_indexed(core: Core) -> list[str]:
    """Every block of a live request's chain is alive under the request's own key."""
    a, out = core.arena, []
    for req in core.requests.values():
        chain = req.chain.view()
        ok = a.alive[chain] & np.all(a.key[chain] == req.keys[:len(chain)], axis=1)
        if not np.all(ok):
            out.append(f"request {req.rid}: chain blocks {chain[~ok].tolist()[:8]} are not indexed under its keys")
    return out


def draft_isolation(core: Core) -> list[str]:
    out = []
    for pool, p in enumerate(core.pools):
        drafts = _states(core, pool, {"DRAFT"})
        bad = np.flatnonzero(drafts & ((p.holders > 0) | (p.leases > 0) | (p.owner < 0)))
        out += [f"{core.infos[pool].name} DRAFT page {b} is indexed, pinned or ownerless" for b in bad]
    return out


def _index_refs(core: Core) -> list[Counter[int]]:
    """Per pool: how many index references each page has (blocks, points)."""
    a, refs = core.arena, [Counter[int]() for _ in core.infos]
    alive = np.flatnonzero(a.alive)
    for col, pool in enumerate(core.by_role[PoolRole.PREFIX]):
        refs[pool].update(a.prefix_pages[alive, col].tolist())
    for col, pool in enumerate(core.by_role[PoolRole.TAIL]):
        refs[pool].update(a.tail_pages[alive, col].tolist())
    for block in np.flatnonzero(a.alive & a.point).tolist():
        boundary = (int(a.position[block]) + 1) * core.block_tokens
        for col, pool in enumerate(core.by_role[PoolRole.WINDOW]):
            b, first = block, core.window_first_block(pool, boundary)
            while b >= 0 and a.position[b] >= first:
                refs[pool][int(a.window_pages[b, col])] += 1
                b = int(a.parent[b])
    for r in refs:
        r.pop(NULL_PAGE, None)
    return refs


def publish_only_when_complete(core: Core) -> list[str]:
    """Every page the index references is PUBLISHED: what match may return was fully written."""
    out = []
    for pool, counts in enumerate(_index_refs(core)):
        p = core.pools[pool]
        out += [f"{core.infos[pool].name} page {page} indexed in state {p.state_name(page)}"
                for page in counts if p.state[page] != p.published]
    return out


def immutable_when_frozen(core: Core) -> list[str]:
    out = []
    for req in core.requests.values():
        for pool, owned in enumerate(req.owned):
            frozen = [pg for pg in owned if core.pools[pool].frozen[pg]]
            out += [f"request {req.rid} may write frozen {core.infos[pool].name} page {pg}" for pg in frozen]
    return out


def slot_single_owner(core: Core) -> list[str]:
    out = []
    for pool, p in enumerate(core.pools):
        owners: dict[int, int] = {}
        for req in core.requests.values():
            for page in req.owned[pool]:
                if owners.setdefault(page, req.rid) != req.rid or p.owner[page] != req.rid:
                    out.append(f"{core.infos[pool].name} page {page} owned twice or mis-recorded")
        private = _states(core, pool, {"RESERVED", "COMPRESSING", "DRAFT", "READY"})
        if int(private.sum()) != len(owners) or p.table.kind != core.infos[pool].kind:
            out.append(f"{core.infos[pool].name}: {int(private.sum())} private pages, {len(owners)} owned")
    return out


def _lru_queue_ordered(core: Core) -> list[str]:
    """Eviction can reach every block: each has a current queue entry, after its children's (live chains aside)."""
    a = core.arena
    alive = np.flatnonzero(a.alive)
    pos = a.lru_pos[alive]
    lost = alive[(pos < a.lru_head) | (pos >= a.lru_len) | (a.lru_block[np.clip(pos, 0, None)] != alive)]
    if lost.size:
        return [f"blocks {lost.tolist()[:8]} have no current LRU queue entry"]
    live = np.zeros(len(a.alive), np.bool_)
    for req in core.requests.values():
        live[req.chain.view()] = True
    child = alive[(a.parent[alive] != NO_BLOCK)]
    parent = a.parent[child]
    late = child[~live[parent] & (a.lru_pos[child] > a.lru_pos[parent])]
    return [f"block {b} comes after its parent {a.parent[b]} in the LRU queue" for b in late.tolist()[:8]]


def no_slot_leak(core: Core) -> list[str]:
    out = _lru_queue_ordered(core)
    for pool, p in enumerate(core.pools):
        free = np.zeros(len(p.state), np.bool_)
        free[p.free] = True
        is_free = p.state == p.table.initial
        is_free[NULL_PAGE] = False
        if len(set(p.free)) != len(p.free) or NULL_PAGE in p.free or np.any(free != is_free):
            out.append(f"{core.infos[pool].name}: free list and FREE pages disagree")
        retired = _states(core, pool, {"RETIRED"})
        orphan = ~is_free & (p.holders == 0) & (p.leases == 0) & (p.owner < 0) & ~retired
        orphan[NULL_PAGE] = False
        out += [f"{core.infos[pool].name} page {b} leaked in {p.state_name(int(b))}" for b in np.flatnonzero(orphan)]
    return out


def refcount_matches_leases(core: Core) -> list[str]:
    out = []
    for pool, (p, refs) in enumerate(zip(core.pools, _index_refs(core), strict=True)):
        pins = Counter(page for r in core.requests.values() for page in r.pinned_versions[pool])
        for page in np.flatnonzero((p.leases > 0) | (p.holders > 0)).tolist() + list(pins) + list(refs):
            if p.leases[page] != pins[page] or p.holders[page] != refs[page]:
                out.append(f"{core.infos[pool].name} page {page}: leases {p.leases[page]} vs {pins[page]}, "
                           f"holders {p.holders[page]} vs {refs[page]}")
    return out


def disk_copy_durable(core: Core) -> list[str]:
    """The device manager has no disk tier: no page may claim to live on disk."""
    out = []
    for pool in range(len(core.pools)):
        bad = np.flatnonzero(_states(core, pool, {"ON_DISK"}))
        out += [f"{core.infos[pool].name} page {b} ON_DISK without a disk tier" for b in bad]
    return out


INVARIANTS: Mapping[str, Check] = MappingProxyType({
    f.__name__: f for f in (copy_endpoints_pinned, pinned_never_freed, lease_versions_current,
                            lease_covers_object_set, draft_isolation, publish_only_when_complete,
                            immutable_when_frozen, slot_single_owner, no_slot_leak, refcount_matches_leases,
                            disk_copy_durable)})


def check_invariants(manager: HasCore | Core) -> list[str]:
    """Every violated invariant of the spec on the live manager, as messages ('name: detail')."""
    core = manager if isinstance(manager, Core) else manager.core
    return [f"{inv.name}: {msg}" for inv in core.spec.invariants for msg in INVARIANTS[inv.name](core)]
