"""Breadth-first exhaustive exploration of the abstract world.

Every event the spec allows on every segment (with every acting request),
and every atomic lease operation, is tried in every reachable world; every
invariant is evaluated in every world.  A violation is reported with the
shortest event trace that reaches it (BFS order).

Two kinds of events are never fired on one segment alone:
- lease events (meta.lease_events) fire as one all-or-nothing operation over
  every device segment of one prefix for one request.  An event whose edges
  add a lease (`add_lease`) needs a request holding no lease, on a prefix
  whose chain (blocks 0..p) is INDEXED - a lease is taken on what a match
  found in the index - and records the versions it pinned; one whose edges
  drop a lease (`drop_lease`) needs the request's lease to be on that prefix
  and clears it;
- reference events (meta.reference_events) fire only inside an index entry's
  `hold_references` / `drop_references` effect.

One step is no event of the spec: `append_tokens` makes the positions of a
segment reserved ahead (`mark_ahead`) known to its owner, the data guard
`tokens_known` reads (the manager's known-token watermark).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator

import attrs

from hkv_core.checker.effects import ACTOR_EFFECTS, ACTOR_GUARDS, apply, fire, passes
from hkv_core.checker.invariants import INVARIANTS
from hkv_core.checker.view import WorldView
from hkv_core.checker.world import CheckConfig, Move, Req, Topology, World
from hkv_core.spec.names import Event
from hkv_core.spec.records import LifecycleSpec
from hkv_core.spec.table import Compiled

Progress = Callable[[int], None]
Label = tuple[str, int]  # ("event(target", acting request or -1): formatted only for traces
PROGRESS_EVERY_STATES = 2_000
WRITE = "write"  # the seed's row writes (not an `Event`: the manager writes rows through copies)


@attrs.frozen(kw_only=True)
class Violation:
    """An invariant that failed in an explored world, with the shortest trace of events that reaches it."""

    invariant: str
    message: str
    trace: tuple[str, ...]


@attrs.frozen(kw_only=True)
class CheckResult:
    """What `check` explored (worlds, transitions, invariant evaluations) and every violation it found."""

    states_explored: int
    transitions_explored: int
    invariants_checked: int
    invariant_names: tuple[str, ...]
    violations: tuple[Violation, ...]
    truncated: bool  # the state cap (config.max_states) stopped the search: worlds within the bound went unexplored
    seconds: float
    events_fired: tuple[str, ...] = ()  # every event some explored transition fired (lease operations included)


def _needs_actor(edge: Compiled) -> bool:
    return bool(ACTOR_GUARDS & set(edge.guard_names) or ACTOR_EFFECTS & set(edge.effects))


def format_label(label: Label) -> str:
    head, actor = label
    return f"{head})" if actor < 0 else f"{head}, r{actor})"


def apply_edge(topo: Topology, world: World, s: int, edge: Compiled, actor: int) -> World | None:
    """The world after segment `s` takes `edge` for `actor`, or None if refused / out of bound."""
    if edge.guards and not passes(edge, WorldView(topo, world, s, actor)):
        return None
    move = Move(world)
    return move.freeze() if apply(topo, move, s, edge, actor) else None


Moves = tuple[tuple[tuple[str, Compiled, tuple[int, ...]], ...], ...]  # per state: (label head, edge, actors)


class Explorer:
    """Successor generation over a Topology; kept apart from the BFS loop."""

    def __init__(self, spec: LifecycleSpec, config: CheckConfig) -> None:
        self.topo = Topology(spec, config)
        self.not_alone = spec.lease_events | spec.reference_events
        self.moves = tuple(self._moves(s) for s in self.topo.all_segs)
        self.lease_ids = {e: tuple(t.event_index.get(e) for t in self.topo.seg_table)
                          for e in self.topo.acquiring_events + self.topo.releasing_events}

    def _moves(self, s: int) -> Moves:
        """Per state of segment `s`: the events fired on it alone, each with the requests that may act."""
        table, reqs = self.topo.seg_table[s], tuple(range(self.topo.config.requests))
        return tuple(tuple((f"{table.events[e]}({self.topo.describe(s)}", edge,
                            reqs if _needs_actor(edge) else (-1,))
                           for e, edge in enumerate(row)
                           if edge is not None and table.events[e] not in self.not_alone)
                     for row in table.rows)

    def successors(self, world: World) -> Iterator[tuple[Label, World]]:
        topo = self.topo
        for s, seg in enumerate(world.segs):
            for head, edge, actors in self.moves[s][seg.state]:
                for actor in actors:
                    nxt = apply_edge(topo, world, s, edge, actor)
                    if nxt is not None:
                        yield (head, actor), nxt
        yield from self.lease_successors(world)
        yield from self.known_successors(world)

    def known_successors(self, world: World) -> Iterator[tuple[Label, World]]:
        """append_tokens: the owner of a segment reserved ahead learns the tokens it was reserved for (the
        manager's known-token watermark passing its first row; what guard `tokens_known` reads)."""
        topo = self.topo
        for s in topo.device_segs:
            seg = world.segs[s]
            if seg.unknown:
                move = Move(world)
                move.segs[s] = seg._replace(unknown=0)
                yield (f"append_tokens({topo.describe(s)}", seg.owner), move.freeze()

    def lease_successors(self, world: World) -> Iterator[tuple[Label, World]]:
        """Every atomic lease operation: acquire on each indexed chain, release of each held lease."""
        topo = self.topo
        for r, req in enumerate(world.reqs):
            if req.lease_prefix >= 0:
                for event in topo.releasing_events:
                    nxt = self.lease(world, r, req.lease_prefix, event, acquire=False)
                    if nxt is not None:
                        yield (f"{event}(p{req.lease_prefix}.*", r), nxt
                continue
            for p in range(topo.config.prefixes):
                if not self.chain_indexed(world, p):
                    break  # a longer chain is not indexed either
                for event in topo.acquiring_events:
                    nxt = self.lease(world, r, p, event, acquire=True)
                    if nxt is not None:
                        yield (f"{event}(p{p}.*", r), nxt

    def chain_indexed(self, world: World, p: int) -> bool:
        """Are blocks 0..p INDEXED (a match could have found this chain)."""
        topo = self.topo
        return all(world.segs[topo.block_of_prefix[q]].state == topo.block_indexed for q in range(p + 1))

    def lease(self, world: World, r: int, p: int, event: str, *, acquire: bool) -> World | None:
        """Fire lease `event` on every device segment of prefix `p` for request `r`, all or nothing."""
        topo, ids, move = self.topo, self.lease_ids[event], Move(world)
        for s in topo.device_of_prefix[p]:
            e = ids[s]
            edge = None if e is None else topo.seg_table[s].rows[move.segs[s].state][e]
            if not fire(topo, move, s, edge, r):
                return None
        versions = tuple(move.segs[s].version for s in topo.device_of_prefix[p])
        move.reqs[r] = Req(lease_prefix=p, lease_versions=versions) if acquire else Req()
        return move.freeze()

    def script(self, world: World, steps: list[tuple[int, str]]) -> list[tuple[Label, World]] | None:
        """Fire `(segment, event)` steps in order (request 0 acts where an edge needs a request).

        None when the spec refuses a step (a broken spec that cannot publish).
        """
        topo, out = self.topo, list[tuple[Label, World]]()
        for s, event in steps:
            table = topo.seg_table[s]
            e = table.event_index.get(event)
            edge = None if e is None else table.rows[world.segs[s].state][e]
            actor = 0 if edge is not None and _needs_actor(edge) else -1
            nxt = None if edge is None else apply_edge(topo, world, s, edge, actor)
            if nxt is None:
                return None
            world = nxt
            out.append(((f"{event}({topo.describe(s)}", actor), world))
        return out

    def stage_steps(self, prefix: int) -> list[tuple[int, str]]:
        """Request 0 reserves and writes every device kind of `prefix` up to READY."""
        topo, rows = self.topo, self.topo.config.rows_per_segment
        events = [Event.RESERVE.value] + [WRITE] * rows + [Event.WRITE_DONE.value]
        return [(s, e) for s in topo.device_of_prefix[prefix] for e in events]

    def fill_steps(self, prefix: int) -> list[tuple[int, str]]:
        """Request 0 reserves every device kind of `prefix` and starts a copy into each (FILLING): what a
        tier load into that prefix's objects begins from."""
        return [(s, e) for s in self.topo.device_of_prefix[prefix] for e in (Event.RESERVE.value, Event.FILL.value)]

    def publish_steps(self, prefix: int) -> list[tuple[int, str]]:
        """Request 0 publishes every (READY) device kind of `prefix`; its block is indexed, its point kept."""
        topo = self.topo
        return [(s, Event.PUBLISH.value) for s in topo.device_of_prefix[prefix]] + [
            (topo.block_of_prefix[prefix], Event.INDEX.value), (topo.point_of_prefix[prefix], Event.KEEP.value)]


Parents = dict[World, tuple[World | None, Label]]


def seed_worlds(explorer: Explorer, parent: Parents) -> list[World]:
    """The empty world, then per prefix k < seeded_prefixes: k staged (READY, owned by request 0), k published;
    last, from the empty world, prefix 0 reserved and filling for request 0 (where a tier load begins).

    Each seed extends an earlier one through real transitions, so every
    trace starts from the empty world.
    """
    empty = explorer.topo.initial_world()
    parent[empty] = (None, ("", -1))
    seeds = [empty]
    steps = [s for prefix in range(explorer.topo.config.seeded_prefixes)
             for s in (explorer.stage_steps(prefix), explorer.publish_steps(prefix))]
    for script in steps:
        world = _scripted(explorer, parent, seeds[-1], script)
        if world is None:  # a (broken) spec that cannot stage or publish: explore from what we have
            break
        seeds.append(world)
    filling = _scripted(explorer, parent, empty, explorer.fill_steps(0))
    return seeds + ([filling] if filling is not None else [])


def _scripted(explorer: Explorer, parent: Parents, world: World, steps: list[tuple[int, str]]) -> World | None:
    """The world after `steps` from `world` (each step's parent recorded), None when the spec refuses one."""
    script = explorer.script(world, steps)
    if script is None:
        return None
    for label, nxt in script:
        parent.setdefault(nxt, (world, label))
        world = nxt
    return world


def check(spec: LifecycleSpec, config: CheckConfig | None = None,
          progress: Progress | None = None) -> CheckResult:
    """Explore every world within `max_depth` events of a seed; check every invariant in each.

    Seeds are the empty world and, for each of the first `seeded_prefixes`
    prefixes, the world where request 0 has written its objects (READY, so
    publish / publish_pinned / abort are within reach) and the world where
    they are published, the block indexed and the point kept; and the world
    where request 0 has reserved prefix 0's objects and started a copy into
    each (a tier load's start).  All are reached through real transitions, so
    traces start from the empty world.  When
    `max_states` worlds are found the search stops growing: every world found
    is still checked, and the result says `truncated`.
    """
    started = time.perf_counter()
    explorer = Explorer(spec, config or CheckConfig())
    topo, names = explorer.topo, tuple(inv.name for inv in spec.invariants)
    checks = [(name, INVARIANTS[name]) for name in names]
    parent: Parents = {}
    seeds = seed_worlds(explorer, parent)
    queue = deque((seed, 0) for seed in seeds)
    depth_of = {seed: 0 for seed in seeds}
    found: dict[str, Violation] = {}
    transitions, truncated, heads = 0, False, set[str]()
    while queue and not (found and topo.config.stop_on_violation):
        world, depth = queue.popleft()
        broken = [(n, msg) for n, fn in checks if (msg := fn(topo, world)) is not None]
        for name, message in broken:
            found.setdefault(name, Violation(invariant=name, message=message,
                                             trace=_trace(parent, world)))
        if broken or depth >= topo.config.max_depth or truncated:
            continue  # once truncated, the worlds already found are checked but not expanded
        for label, nxt in explorer.successors(world):
            transitions += 1
            heads.add(label[0])
            if nxt in depth_of:
                continue
            if len(depth_of) >= topo.config.max_states:
                truncated = True
                break
            parent.setdefault(nxt, (world, label))  # a seed script world keeps its script parent
            depth_of[nxt] = depth + 1
            queue.append((nxt, depth + 1))
            if progress is not None and len(depth_of) % PROGRESS_EVERY_STATES == 0:
                progress(len(depth_of))
    return CheckResult(states_explored=len(depth_of), transitions_explored=transitions,
                       invariants_checked=len(depth_of) * len(checks), invariant_names=names,
                       violations=tuple(found.values()), truncated=truncated,
                       seconds=time.perf_counter() - started,
                       events_fired=tuple(sorted({head.partition("(")[0] for head in heads})))


def _trace(parent: Parents, world: World) -> tuple[str, ...]:
    labels: list[str] = []
    node: World | None = world
    while node is not None:
        prev, label = parent[node]
        if prev is not None:
            labels.append(format_label(label))
        node = prev
    return tuple(reversed(labels))
