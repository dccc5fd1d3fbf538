"""The engine's side of the host and disk tiers: write-through of records, and loads at a hit.

- `store`: when a step ends on a block boundary, the block record (its
  compressed entries) is read from the pools and stored, and so is the point
  record (window rows, tails) where the manager keeps a resume point (host
  first; tiers/tier_cache.py moves records to disk), so what the device evicts
  later is still held below it.
- `plan`: after the device hit at P, runs of blocks whose records the tiers
  hold, each ending at a point record, are the candidates - never past a
  boundary where the request keeps a point the tiers lack (its snapshot would
  be empty), never into the block holding the prompt's last token (one token is
  always computed); the cost model decides how many to load.
- `load`: fetch the chosen records (disk reads on worker threads, each
  checked), allocate up to the deepest end whose records all arrived, and
  copy entries, window rows and tails into the new slots (tails also into the
  snapshot pages of kept points and the working tail) with one load plan the
  manager issues (its targets FILLING until `complete`); then commit: the
  manager publishes them as if they had been computed.  The rest is
  recomputed, and so is the whole allocation when the load plan fails.

Stores and loads move bytes only through plans (`CacheManager.plan_store` /
`plan_load`, StoreRecord / LoadRecord ops run by either executor): one path
between the pools and the tiers.
"""

from __future__ import annotations

import functools
import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.errors import ConfigError, InvalidArgument
from hkv_core.executor import Executor
from hkv_core.layout import Layout, PoolSpec
from hkv_core.manager import Allocation, CacheManager
from hkv_core.tiers.cost import Candidate, CostModel, LoadDecision, Rate, recompute_flops
from hkv_tiers import span_io
from hkv_tiers.disk_store import DiskFaults
from hkv_tiers.record_check import Loaded, Wanted, record_name
from hkv_tiers.remote_config import RemoteTierConfig
from hkv_tiers.tier_cache import TierCache

DEFAULT_COMPUTE_FLOPS_PER_S = 1e9  # until forward passes are measured
DEFAULT_RATES = {"host": (5e9, 2e-6), "disk": (1e9, 1e-4), "remote": (1e9, 5e-4)}  # bytes/s, seconds per record
LOCAL_TIERS = ("host", "disk")


def default_cost(policy: str, compute_flops_per_s: float | None, remote: bool = False) -> CostModel:
    """Starting rates: the given compute rate (kept) or a default the engine's forward passes replace; the
    tiers' defaults until loads are measured (the remote tier's only with one)."""
    compute = Rate(compute_flops_per_s or DEFAULT_COMPUTE_FLOPS_PER_S, fixed=bool(compute_flops_per_s))
    tiers = LOCAL_TIERS + ("remote",) * remote
    return CostModel(compute=compute, tiers={t: Rate(*DEFAULT_RATES[t]) for t in tiers}, policy=policy)


@attrs.frozen(kw_only=True)
class TierOptions:
    """How an engine's tiers are built: a host arena of `host_bytes`, a disk tier in `directory` (None: host
    only) of `disk_bytes`, the decision `policy` (hkv_core.tiers.cost.POLICIES), a compute rate to use instead
    of measuring one, injected disk faults (tests), the cap on disk loads in flight, and a shared remote tier
    (`remote`: a Mooncake Store master, docs/remote.md)."""

    directory: str | Path | None = None
    host_bytes: int = 0
    disk_bytes: int = 1 << 30
    policy: str = "cost"
    compute_flops_per_s: float | None = None
    faults: DiskFaults | None = None
    loads_in_flight: int = 4
    remote: RemoteTierConfig | None = None

    def link(self, manager: CacheManager, model_id: str) -> TierLink:
        """The TierCache (opened on `directory`) and the link between it and `manager`'s pools."""
        seed = manager.config.key_seed
        if seed is None and self.directory is not None:
            raise ConfigError("a disk tier outlives the process: its keys need a fixed key_seed, not a random one",
                              source="ManagerConfig", key="key_seed")
        if seed is None and self.remote is not None:
            raise ConfigError("a remote tier is shared: every instance needs the same fixed key_seed, not a random "
                              "one", source="ManagerConfig", key="key_seed")
        if self.remote is not None and not isinstance(self.remote, RemoteTierConfig):
            raise InvalidArgument(action="Engine", argument="remote", value=self.remote,
                                  reason=f"must be None or a RemoteTierConfig, got {type(self.remote).__name__}")
        for name in ("host_bytes", "disk_bytes", "loads_in_flight"):
            value = getattr(self, name)
            least = int(name == "loads_in_flight")
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < least:
                raise InvalidArgument(action="Engine", argument=name, value=value,
                                      reason=f"must be an integer >= {least}")
        rate = self.compute_flops_per_s
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float | np.number)
                                 or not math.isfinite(rate) or rate <= 0):
            raise InvalidArgument(action="Engine", argument="compute_flops_per_s", value=rate,
                                  reason="must be None (measured) or a finite number of FLOPs per second > 0")
        if self.faults is not None and not isinstance(self.faults, DiskFaults):
            raise InvalidArgument(action="Engine", argument="disk_faults", value=self.faults,
                                  reason=f"must be None or a DiskFaults, got {type(self.faults).__name__}")
        pools = tuple(b.spec for b in manager.bindings())
        cost = default_cost(self.policy, self.compute_flops_per_s, remote=self.remote is not None)
        cache = TierCache(pools=pools, layout_fingerprint=manager.layout.fingerprint(), model_id=model_id,
                          key_seed=seed or 0, host_bytes=int(self.host_bytes), directory=self.directory,
                          disk_bytes=int(self.disk_bytes), faults=self.faults,
                          loads_in_flight=int(self.loads_in_flight), remote=self.remote,
                          eviction=manager.config.eviction)  # the device's policy orders the tiers too
        return TierLink(cache, cost, manager.layout, pools)


@attrs.define
class TierPlan:
    """A request's decision, the candidates it chose from, its block keys from the device hit on, and the
    boundaries where it keeps resume points (each needs its point record)."""

    decision: LoadDecision
    candidates: list[Candidate]
    keys: NDArray[np.uint64]
    retained: set[int]


class TierLink:
    """Block and point records between an engine's pools and a TierCache, with the cost model."""

    def __init__(self, cache: TierCache, cost: CostModel, layout: Layout, pools: tuple[PoolSpec, ...]) -> None:
        self.cache, self.cost, self.layout, self.pools = cache, cost, layout, pools
        self.block = layout.block_tokens
        self.kinds = tuple(k for k in span_io.KINDS if span_io.pools_of(pools, k))  # no window or tail: no points

    def observe_compute(self, lo: int, hi: int, seconds: float) -> None:
        self.cost.compute.observe(recompute_flops(self.layout, lo, hi), seconds)

    def _bytes(self, kind: str, hi: int) -> int:
        return span_io.payload_bytes(self.layout, self.pools, kind, hi - self.block, hi)

    def _want(self, kind: str, key: NDArray[np.uint64], hi: int) -> Wanted:
        lo, end = span_io.token_range(self.layout, kind, hi - self.block, hi)
        return Wanted(kind, key, lo, end, self._bytes(kind, hi))

    def _lo(self, want: Wanted) -> int:
        """Where span_io reads and writes a record from: its block's start, or (a point) its window's."""
        return want.hi - self.block if want.kind == span_io.BLOCK else want.lo

    def touch_request(self, manager: CacheManager, rid: int) -> None:
        """A request ends: its records, device hit included, become the most recent, deepest first (so its
        head ends most recent: a tier drops a prefix's tail before its head)."""
        computed = manager.request_tokens(rid)[0]
        keys = manager.block_keys(rid, 0, computed // self.block)
        self.cache.touch([record_name(key, kind) for key in keys for kind in self.kinds])

    def plan(self, manager: CacheManager, rid: int, device_tokens: int, prompt_tokens: int) -> TierPlan:
        """Candidates after the device hit - runs of blocks the tiers hold, each ending at a point record they
        hold, never past a kept boundary without its point nor into the prompt's last block - and the decision."""
        limit = (prompt_tokens - 1) // self.block * self.block
        keys = manager.block_keys(rid, device_tokens // self.block)
        held = self.cache.locate([record_name(key, kind) for key in keys for kind in self.kinds])
        if len(keys) and span_io.BLOCK in self.kinds and held[record_name(keys[0], span_io.BLOCK)] is not None:
            manager.skip_junction(rid)  # a load brings the points its tier holds: a junction would cut it short
        retained = set(manager.retained_boundaries(rid, device_tokens, limit)) if limit > device_tokens else set()
        candidates, run = [], _Run(device_tokens)
        for i, key in enumerate(keys):
            hi = device_tokens + (i + 1) * self.block
            block, point = (held[record_name(key, kind)] if kind in self.kinds else "device"
                            for kind in span_io.KINDS)
            if hi > limit or block is None or (point is None and hi in retained):
                break
            run.add(block, self.block, self._bytes(span_io.BLOCK, hi))
            if point is not None:
                run.add(point, 0, self._bytes(span_io.POINT, hi))
                candidates.append(run.close(hi))
                run = _Run(hi)
        return TierPlan(decision=self.cost.decide(self.layout, device_tokens, candidates), candidates=candidates,
                        keys=keys, retained=retained)

    def load(self, manager: CacheManager, executor: Executor, rid: int, plan: TierPlan,
             run_plan: Callable[[Allocation], Allocation],
             compute: Callable[[Allocation], None]) -> dict[str, int]:
        """Fetch the chosen records (checked), then allocate, load (one plan) and commit up to the deepest end
        whose records all arrived; tokens loaded per tier (blocks count for the tier of their block record).
        When the load plan fails, `compute(alloc)` computes and commits the allocation instead (nothing
        counts as loaded)."""
        out = dict.fromkeys(self.cost.tiers, 0)
        chosen = plan.candidates[:plan.decision.chosen]
        if not chosen:
            return out
        start, ends = chosen[0].lo, {c.hi for c in chosen}
        points = sorted(ends | {b for b in plan.retained if b <= chosen[-1].hi})
        his = range(start + self.block, chosen[-1].hi + 1, self.block)
        key = {hi: plan.keys[(hi - start) // self.block - 1] for hi in his}
        wanted = [self._want(span_io.BLOCK, key[hi], hi) for hi in his if span_io.BLOCK in self.kinds]
        wanted += [self._want(span_io.POINT, key[hi], hi) for hi in points if span_io.POINT in self.kinds]
        wanted.sort(key=lambda w: (w.hi, w.kind == span_io.POINT))  # prefix order: what fits a tier's room is usable
        key_hi = {w.name: w.hi for w in wanted}  # touched head to tail, each block's records together
        got = dict(zip([(w.kind, w.hi) for w in wanted], self.cache.fetch(wanted), strict=True))
        end = self._deepest_end(start, sorted(ends), plan.retained, got)
        if end == start:
            return out
        alloc = run_plan(manager.allocate(rid, end - start))
        rows, buffers, loaded = [], {}, dict.fromkeys(self.cost.tiers, 0)
        for w in wanted:
            found = got[(w.kind, w.hi)]
            if found is None or w.hi > end or (w.kind == span_io.POINT and w.hi not in plan.retained | {end}):
                continue
            tier, payload, seconds = found
            rows += span_io.load_rows(self.layout, self.pools, w.kind, alloc, self._lo(w), w.hi, w.name,
                                      last=w.hi == end)
            buffers[w.name] = span_io.buffer_of(payload)
            self.cost.tiers[tier].observe(len(payload), seconds)
            loaded[tier] += self.block if w.kind == span_io.BLOCK else 0
        if not span_io.run_load(manager, executor, rid, rows, buffers).ok:
            self.cache.counts["load_failed"] += 1
            compute(alloc)  # the same pages, computed: a failed copy costs a recompute, never a wrong row
            return out
        out.update(loaded)
        manager.commit(rid, end - start)
        for w in wanted:  # what came from the remote store is kept locally too
            found = got[(w.kind, w.hi)]
            if found is not None and found[0] == "remote" and w.hi <= end:
                self.cache.keep_local(w, found[1])
        self.cache.touch(sorted((w.name for w in wanted if w.hi <= end), key=lambda n: (key_hi[n], n)))
        return out

    def _deepest_end(self, start: int, ends: list[int], retained: set[int],
                     got: dict[tuple[str, int], Loaded | None]) -> int:
        """The deepest candidate end whose block records, kept points and own point all arrived."""
        best = start
        for end in ends:
            blocks = all(got.get((span_io.BLOCK, hi), True) is not None
                         for hi in range(start + self.block, end + 1, self.block))
            points = all(got.get((span_io.POINT, b), True) is not None for b in retained | {end} if b <= end)
            if not (blocks and points):
                break
            best = end
        return best

    def _store_into(self, manager: CacheManager, executor: Executor, rid: int, kind: str, alloc: Allocation,
                    lo: int, hi: int, name: str, out: NDArray[np.uint8]) -> None:
        """Fill a record's host extent `out` from the pools by a store plan (only when the cache stores it)."""
        rows = span_io.store_rows(self.layout, self.pools, kind, alloc, lo, hi, name)
        span_io.run_store(manager, executor, rid, rows, {name: out})

    def store(self, manager: CacheManager, executor: Executor, rid: int, alloc: Allocation, hi: int) -> None:
        """After a step that ended at `hi`: the block record of the block ending there (when `hi` is a block
        boundary and the block is keyed: its tokens are verified), and the point record at `hi` when the
        manager keeps a resume point there."""
        if hi % self.block or not hi:
            return
        keys = manager.block_keys(rid, hi // self.block - 1, 1)  # one key: a step must not copy the prompt's
        if not len(keys):
            return
        began = time.perf_counter()
        for kind in self.kinds:
            if kind == span_io.POINT and hi not in alloc.snapshots:
                continue
            want = self._want(kind, keys[0], hi)
            if self.cache.where(want.name) is not None:
                self.cache.touch([want.name])
                continue
            self.cache.store(kind, keys[0], want.lo, want.hi, want.nbytes, functools.partial(
                self._store_into, manager, executor, rid, kind, alloc, self._lo(want), hi, want.name))
        self.cache.counts["store_us"] += int((time.perf_counter() - began) * 1e6)


@attrs.define
class _Run:
    """Blocks gathered into the next candidate: tokens, bytes and records per tier."""

    lo: int
    tokens: Counter[str] = attrs.field(factory=Counter)
    nbytes: Counter[str] = attrs.field(factory=Counter)
    records: Counter[str] = attrs.field(factory=Counter)

    def add(self, tier: str, tokens: int, nbytes: int) -> None:
        """A record of `tier` (\"device\": a kind this layout does not have: nothing to load)."""
        if tier == "device":
            return
        self.tokens[tier] += tokens
        self.nbytes[tier] += nbytes
        self.records[tier] += 1

    def close(self, hi: int) -> Candidate:
        return Candidate(lo=self.lo, hi=hi, tokens=dict(self.tokens), bytes=dict(self.nbytes),
                         records=dict(self.records))
