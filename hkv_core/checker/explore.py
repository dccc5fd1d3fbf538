"""Breadth-first exhaustive exploration of the abstract world.

Every event the spec allows on every segment (with every acting request), and
every atomic lease acquire / release, is tried in every reachable world;
every invariant is evaluated in every world.  A violation is reported with the
shortest event trace that reaches it (BFS order).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator

import attrs

from hkv_core.checker.effects import ACTOR_EFFECTS, ACTOR_GUARDS, EFFECTS
from hkv_core.checker.invariants import INVARIANTS
from hkv_core.checker.view import WorldView
from hkv_core.checker.world import CheckConfig, Req, Topology, World
from hkv_core.spec.records import LifecycleSpec
from hkv_core.spec.table import Compiled

Progress = Callable[[int], None]
PROGRESS_EVERY_STATES = 2_000


@attrs.frozen(kw_only=True)
class Violation:
    invariant: str
    message: str
    trace: tuple[str, ...]


@attrs.frozen(kw_only=True)
class CheckResult:
    states_explored: int
    transitions_explored: int
    invariants_checked: int
    invariant_names: tuple[str, ...]
    violations: tuple[Violation, ...]
    truncated: bool
    seconds: float


def _needs_actor(edge: Compiled) -> bool:
    return bool(ACTOR_GUARDS & set(edge.guard_names) or ACTOR_EFFECTS & set(edge.effects))


def apply_edge(topo: Topology, world: World, s: int, edge: Compiled, actor: int) -> World | None:
    """The world after segment `s` takes `edge` for `actor`, or None if refused / out of bound."""
    view = WorldView(topo, world, s, actor)
    for guard in edge.guards:
        if not guard(view):
            return None
    seg, free = world.segs[s], world.free_slots
    for name in edge.effects:
        moved = EFFECTS[name](seg, free, actor, topo.config)
        if moved is None:
            return None
        seg, free = moved
    segs = world.segs[:s] + (seg._replace(state=edge.dest),) + world.segs[s + 1:]
    return World(segs=segs, reqs=world.reqs, free_slots=free)


class Explorer:
    """Successor generation over a Topology; kept apart from the BFS loop."""

    def __init__(self, spec: LifecycleSpec, config: CheckConfig) -> None:
        self.topo = Topology(spec, config)
        self.lease_events = spec.lease_events
        self.moves = {kind: self._moves(kind) for kind in self.topo.tables}

    def _moves(self, kind: str) -> list[list[tuple[str, Compiled, tuple[int, ...]]]]:
        table, reqs = self.topo.tables[kind], tuple(range(self.topo.config.requests))
        return [[(table.events[e], edge, reqs if _needs_actor(edge) else (-1,))
                 for e, edge in enumerate(row)
                 if edge is not None and table.events[e] not in self.lease_events]
                for row in table.rows]

    def successors(self, world: World) -> Iterator[tuple[str, World]]:
        topo = self.topo
        for s, seg in enumerate(world.segs):
            for event, edge, actors in self.moves[topo.seg_kind[s]][seg.state]:
                for actor in actors:
                    nxt = apply_edge(topo, world, s, edge, actor)
                    if nxt is not None:
                        yield f"{event}({topo.describe(s)}{'' if actor < 0 else f', r{actor}'})", nxt
        for r, req in enumerate(world.reqs):
            if req.lease_prefix < 0:
                for p in range(topo.config.prefixes):
                    nxt = self.lease(world, r, p, "pin")
                    if nxt is not None:
                        yield f"acquire(r{r}, p{p})", nxt
            else:
                nxt = self.lease(world, r, req.lease_prefix, "unpin")
                if nxt is not None:
                    yield f"release(r{r}, p{req.lease_prefix})", nxt

    def lease(self, world: World, r: int, p: int, event: str) -> World | None:
        """Pin (or unpin) every device kind of prefix `p` for request `r`, all or nothing."""
        topo = self.topo
        for s in topo.device_of_prefix[p]:
            table = topo.seg_table[s]
            edge = table.rows[world.segs[s].state][table.event_index[event]]
            nxt = None if edge is None else apply_edge(topo, world, s, edge, r)
            if nxt is None:
                return None
            world = nxt
        versions = tuple(world.segs[s].version for s in topo.device_of_prefix[p])
        req = Req(lease_prefix=p, lease_versions=versions) if event == "pin" else Req()
        return world._replace(reqs=world.reqs[:r] + (req,) + world.reqs[r + 1:])


    def publish_script(self, world: World, prefix: int) -> list[tuple[str, World]] | None:
        """Request 0 writes and publishes every device kind of `prefix`; None if the spec refuses."""
        steps: list[tuple[str, World]] = []
        rows = self.topo.config.rows_per_segment
        for s in self.topo.device_of_prefix[prefix]:
            for event in ["reserve"] + ["write"] * rows + ["write_done", "publish"]:
                table = self.topo.seg_table[s]
                edge = table.rows[world.segs[s].state][table.event_index[event]]
                nxt = None if edge is None else apply_edge(self.topo, world, s, edge, 0)
                if nxt is None:
                    return None
                world = nxt
                steps.append((f"{event}({self.topo.describe(s)}, r0)", world))
        return steps


Parents = dict[World, tuple[World | None, str]]


def _seeds(explorer: Explorer, parent: Parents) -> list[World]:
    """The empty world and worlds with the first k prefixes published (k = 1..seeded)."""
    world = explorer.topo.initial_world()
    parent[world] = (None, "")
    seeds = [world]
    for prefix in range(explorer.topo.config.seeded_prefixes):
        script = explorer.publish_script(world, prefix)
        if script is None:  # a (broken) spec that cannot publish: explore from what we have
            break
        for label, nxt in script:
            parent.setdefault(nxt, (world, label))
            world = nxt
        seeds.append(world)
    return seeds


def check(spec: LifecycleSpec, config: CheckConfig | None = None,
          progress: Progress | None = None) -> CheckResult:
    """Explore every world within `max_depth` events of a seed; check every invariant in each.

    Seeds are the empty world and worlds reached by publishing the first
    `seeded_prefixes` prefixes (reached through real transitions, so traces
    start from the empty world).
    """
    started = time.perf_counter()
    explorer = Explorer(spec, config or CheckConfig())
    topo, names = explorer.topo, tuple(inv.name for inv in spec.invariants)
    checks = [(name, INVARIANTS[name]) for name in names]
    parent: Parents = {}
    seeds = _seeds(explorer, parent)
    queue = deque((seed, 0) for seed in seeds)
    depth_of = {seed: 0 for seed in seeds}
    found: dict[str, Violation] = {}
    transitions, truncated = 0, False
    while queue:
        world, depth = queue.popleft()
        broken = [(n, msg) for n, fn in checks if (msg := fn(topo, world)) is not None]
        for name, message in broken:
            found.setdefault(name, Violation(invariant=name, message=message,
                                             trace=_trace(parent, world)))
        if broken or depth >= topo.config.max_depth:
            continue
        for label, nxt in explorer.successors(world):
            transitions += 1
            if nxt in depth_of:
                continue
            if len(depth_of) >= topo.config.max_states:
                truncated = True
                continue
            parent.setdefault(nxt, (world, label))
            depth_of[nxt] = depth + 1
            queue.append((nxt, depth + 1))
            if progress is not None and len(depth_of) % PROGRESS_EVERY_STATES == 0:
                progress(len(depth_of))
    return CheckResult(states_explored=len(depth_of), transitions_explored=transitions,
                       invariants_checked=len(depth_of) * len(checks), invariant_names=names,
                       violations=tuple(found.values()), truncated=truncated,
                       seconds=time.perf_counter() - started)


def _trace(parent: Parents, world: World) -> tuple[str, ...]:
    labels: list[str] = []
    node: World | None = world
    while node is not None:
        prev, label = parent[node]
        if prev is not None:
            labels.append(label)
        node = prev
    return tuple(reversed(labels))
