"""The roles of page pools (prefix, window, tail, scratch): see roles/base.py."""

from __future__ import annotations

from hkv_core.manager.lanes import LaneSpec, PoolRole
from hkv_core.manager.page_pools import FIRED, PoolSlots
from hkv_core.manager.roles.base import Builder, Condition, Moves, Role, Shared
from hkv_core.manager.roles.prefix import PrefixRole
from hkv_core.manager.roles.scratch import ScratchRole
from hkv_core.manager.roles.state import StateRole
from hkv_core.manager.roles.tail import TailRole
from hkv_core.manager.roles.window import WindowRole, window_width
from hkv_core.spec.names import Event

ROLE_CLASSES: dict[PoolRole, type[Role]] = {PoolRole.PREFIX: PrefixRole, PoolRole.WINDOW: WindowRole,
                                            PoolRole.TAIL: TailRole, PoolRole.SCRATCH: ScratchRole,
                                            PoolRole.STATE: StateRole}
POINT_ROLES = (PoolRole.WINDOW, PoolRole.TAIL, PoolRole.STATE)  # roles whose pools points refer to, in column order


def pools_of(pools: tuple[PoolSlots, ...], role: PoolRole) -> tuple[PoolSlots, ...]:
    """The page pools of one role, in pool order."""
    return tuple(p for p in pools if p.spec.role is role)


def events_fired(lanes: tuple[LaneSpec, ...]) -> dict[int, tuple[Event, ...]]:
    """Per page pool: every event the manager fires on its objects (all pools', plus its role's)."""
    return {lane.index: FIRED + ROLE_CLASSES[lane.role].FIRES for lane in lanes}


def block_columns(pools: tuple[PoolSlots, ...]) -> list[PoolSlots]:
    """The page pools each block of the index refers to (prefix pools), in pool order."""
    return list(pools_of(pools, PoolRole.PREFIX))


def point_columns(pools: tuple[PoolSlots, ...]) -> list[tuple[PoolSlots, int]]:
    """(pool, width) of each point-table column: window pools (their window's pages), then tail pools, then
    state pools (in PoolRole order, as build_roles numbers them)."""
    windows = [(p, window_width(p.spec.window_tokens, p.spec.tokens_per_page))
               for p in pools_of(pools, PoolRole.WINDOW)]
    return windows + [(p, 1) for role in (PoolRole.TAIL, PoolRole.STATE) for p in pools_of(pools, role)]


def build_roles(shared: Shared, pools: tuple[PoolSlots, ...]) -> tuple[Role, ...]:
    """One role object per role that has pools: prefix (block columns), then window and tail (point columns)."""
    roles: list[Role] = []
    point_column = 0
    for role in PoolRole:
        mine = pools_of(pools, role)
        if not mine:
            continue
        roles.append(ROLE_CLASSES[role](shared, mine, point_column if role in POINT_ROLES else 0))
        point_column += len(mine) if role in POINT_ROLES else 0
    return tuple(roles)


__all__ = ["Builder", "Condition", "Moves", "PrefixRole", "Role", "ScratchRole", "Shared", "StateRole", "TailRole",
           "WindowRole", "block_columns", "build_roles", "events_fired", "point_columns", "pools_of"]
