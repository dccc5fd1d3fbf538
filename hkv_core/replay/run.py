"""Replay a request trace through the real CacheManager's metadata path (no model, no bytes).

Each request, in timestamp order, is served whole: add_request (its prompt
hashed into block keys), match, acquire, allocate and commit every token
after the hit, release; allocation evicts under the manager's policy when the
pools (sized from `capacity_tokens`) are full.  Outputs are not inserted (the
trace's later inputs already contain earlier turns).  A request whose
uncached part does not fit even an emptied cache is counted as uncached: it
keeps its hit and computes the rest without caching it (nor using tiers).
Traces must be prefix-consistent (a block id at a position always follows
the same parent); `replay` refuses one that is not.

Hits differ from a plain block-level simulation in two ways, both by design:
the prompt's last, partial block is never cached (only complete blocks get
keys), and a hit leaves at least one token to compute (a prompt cached whole
resumes one block before its end).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.errors import ConfigError, OutOfPages
from hkv_core.layout import Layout
from hkv_core.layout.presets import load_preset_config
from hkv_core.layout.recurrent import SSM_DTYPE_KEY
from hkv_core.manager import CacheManager, ManagerConfig, estimate_device_bytes
from hkv_core.manager.config import DEFAULT_RETAIN_EVERY_BLOCKS
from hkv_core.manager.index.adaptive import AdaptivePolicy
from hkv_core.plan import Completion
from hkv_core.replay.belady import NEVER, BeladyPolicy
from hkv_core.replay.budget import demand_share, pages_for_budget
from hkv_core.replay.tiers import TierReplay, TierTotals
from hkv_core.replay.trace import TraceRequest, check_requests, prompt_of

__all__ = ["POLICIES", "ReplayConfig", "ReplayResult", "layout_of", "manager_for", "next_uses", "replay"]

POLICIES = ("lru", "belady", "adaptive")  # eviction policies a replay can run (belady: offline, from hints)
SPARE_PAGES = 16  # beyond the trace's unique blocks, for an "infinite" cache


@attrs.frozen(kw_only=True)
class ReplayConfig:
    """What to replay on: a preset layout at `block_tokens`, pools holding `capacity_tokens` (None: every
    block of the trace fits) or, instead, `memory_bytes` of device memory split between per-token pages and
    point snapshots (hkv_core.replay.budget; `state_share` of it to the snapshots, None: the trace's own
    demand), and an eviction policy.  `state_dtype` keeps a linear layer's recurrent state in that dtype
    (the layout option hkv.ssm_state_dtype; None: the preset's)."""

    layout: str = "llama_full"
    block_tokens: int = 512
    capacity_tokens: int | None = None
    policy: str = "lru"
    host_tokens: int = 0  # a host tier below the device (hkv_core.replay.tiers; 0: none)
    disk_tokens: int = 0  # a disk tier below the host (0: none)
    memory_bytes: int | None = None
    state_share: float | None = None
    state_dtype: str | None = None
    retain_every_blocks: int = DEFAULT_RETAIN_EVERY_BLOCKS  # the manager's periodic resume points

    def __attrs_post_init__(self) -> None:
        self._check_budget()
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown policy {self.policy!r}; the choices: {', '.join(POLICIES)}",
                              source="replay", key="policy")
        if self.capacity_tokens is not None and self.capacity_tokens < self.block_tokens:
            raise ConfigError(f"must hold at least one block of {self.block_tokens} tokens, got "
                              f"{self.capacity_tokens}", source="replay", key="capacity_tokens")
        if isinstance(self.block_tokens, bool) or not isinstance(self.block_tokens, int) or self.block_tokens < 1:
            raise ConfigError(f"must be an integer >= 1, got {self.block_tokens!r}", source="replay",
                              key="block_tokens")
        for key in ("host_tokens", "disk_tokens"):
            if getattr(self, key) < 0:
                raise ConfigError(f"must be >= 0, got {getattr(self, key)}", source="replay", key=key)

    def _check_budget(self) -> None:
        if self.memory_bytes is not None:
            if self.capacity_tokens is not None:
                raise ConfigError("give capacity_tokens or memory_bytes, not both", source="replay",
                                  key="memory_bytes")
            if isinstance(self.memory_bytes, bool) or not isinstance(self.memory_bytes, int) or self.memory_bytes < 1:
                raise ConfigError(f"must be an integer >= 1, got {self.memory_bytes!r}", source="replay",
                                  key="memory_bytes")
        if self.state_share is not None:
            if self.memory_bytes is None:
                raise ConfigError("splits memory_bytes: give it too", source="replay", key="state_share")
            if not 0.0 < self.state_share < 1.0:
                raise ConfigError(f"must be in (0, 1), got {self.state_share}", source="replay", key="state_share")
        if isinstance(self.retain_every_blocks, bool) or not isinstance(self.retain_every_blocks, int) \
                or self.retain_every_blocks < 1:
            raise ConfigError(f"must be an integer >= 1, got {self.retain_every_blocks!r}", source="replay",
                              key="retain_every_blocks")


@attrs.frozen(kw_only=True)
class ReplayResult:
    """Hit rates and counts of one replay."""

    layout: str
    policy: str
    capacity_tokens: int | None
    requests: int
    prompt_tokens: int
    blocks: int  # the trace's blocks (hash ids), partial last blocks included
    hit_tokens: int
    hit_blocks: int
    tokens_recomputed: int
    evicted_blocks: int
    uncached_requests: int  # too large for the cache: computed whole, nothing kept
    seconds: float
    memory_bytes: int | None = None  # the budget asked for (None: capacity_tokens per pool)
    device_bytes: int = 0  # what the manager's pools take on a device, NULL pages included
    state_share: float = 0.0  # the part of device_bytes in point snapshots
    tiers: TierTotals | None = None  # with host / disk tiers: tokens and bytes loaded per tier, decisions
    hits: tuple[int, ...] = attrs.field(default=(), repr=False)  # each request's hit tokens, in replay order

    @property
    def block_hit_rate(self) -> float:
        return self.hit_blocks / max(1, self.blocks)

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / max(1, self.prompt_tokens)

    @property
    def requests_per_second(self) -> float:
        return self.requests / max(self.seconds, 1e-9)

    def to_dict(self) -> dict[str, object]:
        out = attrs.asdict(self)
        del out["hits"]  # one number per request: in the result, not in its summary
        out["tiers"] = self.tiers.to_dict() if self.tiers is not None else None
        out.update(block_hit_rate=round(self.block_hit_rate, 4), token_hit_rate=round(self.token_hit_rate, 4),
                   requests_per_second=round(self.requests_per_second, 1))
        return out


def layout_of(config: ReplayConfig) -> Layout:
    """The preset at the replay's block size, its recurrent state in `state_dtype` when one is given."""
    if config.state_dtype is None:
        return Layout.from_preset(config.layout, block_tokens=config.block_tokens)
    raw = load_preset_config(config.layout)
    raw["hkv"] = {**raw.get("hkv", {}), SSM_DTYPE_KEY: config.state_dtype}
    return Layout.from_hf_config(raw, name=config.layout, block_tokens=config.block_tokens)


def _pool_pages(layout: Layout, requests: Sequence[TraceRequest], config: ReplayConfig) -> dict[str, int]:
    """Pages per pool: from the memory budget, else `capacity_tokens` per pool (None: every block fits)."""
    if config.memory_bytes is not None:
        share = config.state_share
        if share is None:
            share = demand_share(layout, requests, config.retain_every_blocks)
        return pages_for_budget(layout, config.memory_bytes, share)
    capacity = config.capacity_tokens
    if capacity is None:
        unique = len({(i, h) for r in requests for i, h in enumerate(r.hash_ids)})
        capacity = (unique + SPARE_PAGES) * config.block_tokens
    return {spec.name: max(1, capacity // spec.tokens_per_page) for spec in layout.pools}


def manager_for(requests: Sequence[TraceRequest], config: ReplayConfig, *, kv_events: bool = False) -> CacheManager:
    """A manager whose pools hold `capacity_tokens` each, or fit `memory_bytes` (or every block of the trace);
    key seed 0, shared by every instance of a cluster replay."""
    layout = layout_of(config)
    longest = max(r.input_length for r in requests)
    belady = config.policy == "belady"  # the offline optimum: a policy of its own, given to the constructor
    pages = _pool_pages(layout, requests, config)
    snapshot_pages = [pages[spec.name] for spec in layout.pools if spec.snapshot]
    settings = ManagerConfig(pool_pages=pages, max_requests=1, max_request_tokens=longest, key_seed=0,
                             max_points=min(snapshot_pages) if snapshot_pages else None, kv_events=kv_events,
                             retain_every_blocks=config.retain_every_blocks,
                             eviction="lru" if belady else config.policy)
    return CacheManager(layout, settings, eviction_policy=(lambda rows, keys: BeladyPolicy(rows)) if belady else None)


def _device_split(m: CacheManager) -> tuple[int, float]:
    """The manager's device bytes and the share of them in point snapshots."""
    estimate = estimate_device_bytes(m.layout, m.config)
    snapshots = sum(estimate.pools[spec.name] for spec in m.layout.pools if spec.snapshot)
    return estimate.total, snapshots / max(1, estimate.total)


Hint = Callable[[CacheManager, int], None]  # told before a request's release: the manager, the request id


def _serve(m: CacheManager, tokens: NDArray[np.int64], hint: Hint | None) -> tuple[int, bool]:
    """One request, start to end: (its hit tokens, whether its uncached part fitted the cache)."""
    rid = m.add_request(tokens)
    try:
        hit = m.match(rid)
        m.acquire(rid, hit)
        try:
            alloc = m.allocate(rid, len(tokens) - hit.tokens)
        except OutOfPages:
            return hit.tokens, False
        if alloc.plan is not None:  # no bytes in a replay: its copies (hybrid layouts) complete at once
            m.complete(alloc.plan.plan_id, Completion(ops_run=len(alloc.plan.ops)))
        m.commit(rid, len(tokens) - hit.tokens)
        return hit.tokens, True
    finally:
        if hint is not None:  # release touches the chain: what the policy is told first
            hint(m, rid)
        m.release(rid)


def next_uses(requests: Sequence[TraceRequest]) -> list[NDArray[np.int64]]:
    """Per request, per block position: the index of the next request with the same block there (NEVER: none)."""
    seen: dict[tuple[int, int], int] = {}
    out: list[NDArray[np.int64]] = [np.zeros(0, np.int64)] * len(requests)
    for i in range(len(requests) - 1, -1, -1):
        ids = requests[i].hash_ids
        out[i] = np.array([seen.get((j, h), NEVER) for j, h in enumerate(ids)], np.int64)
        seen.update(((j, h), i) for j, h in enumerate(ids))
    return out


def _hints(m: CacheManager, requests: Sequence[TraceRequest], policy: str) -> list[Hint]:
    """Per request, what the manager's policy (built by `manager_for`) is told before the release (none for
    lru)."""
    running = m.core.index.policy
    if policy == "belady":  # the offline optimum: the index orders eviction by each block's next use
        assert isinstance(running, BeladyPolicy), running
        belady = running
        future = next_uses(requests)

        def next_use(at: int) -> Hint:
            def tell(m: CacheManager, rid: int) -> None:
                chain = np.asarray(m.chain(rid), np.int32)
                belady.hint(chain, future[at][:len(chain)])
            return tell
        return [next_use(i) for i in range(len(requests))]
    if policy == "adaptive":  # online: told only what serving knows at the release (the output's length)
        assert isinstance(running, AdaptivePolicy), running
        adaptive = running

        def output(tokens: int) -> Hint:
            return lambda m, rid: adaptive.hint(tokens)
        return [output(r.output_length) for r in requests]
    return []


def replay(requests: Sequence[TraceRequest], config: ReplayConfig,
           progress: Callable[[int], None] | None = None) -> ReplayResult:
    """Serve every request through a fresh manager; `progress(done)` every 100 requests.  ConfigError for an
    empty trace, one whose hash ids do not match `block_tokens`, or one that is not prefix-consistent."""
    check_requests(requests, config.block_tokens)
    m = manager_for(requests, config)
    hints = _hints(m, requests, config.policy)
    bt, hits, uncached, loaded = config.block_tokens, [], 0, 0
    tiers = (TierReplay(m.layout, config.host_tokens // bt, config.disk_tokens // bt)
             if config.host_tokens or config.disk_tokens else None)
    began = time.perf_counter()
    for done, request in enumerate(requests, 1):
        hit, fitted = _serve(m, prompt_of(request, bt), hints[done - 1] if hints else None)
        hits.append(hit)
        uncached += not fitted
        if tiers is not None and fitted:  # a request that did not fit computed its rest uncached
            loaded += tiers.serve(request.hash_ids, hit // bt, request.input_length)
            tiers.store(request.hash_ids, request.input_length // bt)
        if progress is not None and done % 100 == 0:
            progress(done)
    seconds = time.perf_counter() - began
    prompt, hit_tokens = sum(r.input_length for r in requests), sum(hits)
    device_bytes, state_share = _device_split(m)
    return ReplayResult(layout=config.layout, policy=config.policy, capacity_tokens=config.capacity_tokens,
                        memory_bytes=config.memory_bytes, device_bytes=device_bytes, state_share=state_share,
                        requests=len(requests), prompt_tokens=prompt, blocks=sum(len(r.hash_ids) for r in requests),
                        hit_tokens=hit_tokens, hit_blocks=hit_tokens // bt,  # hits end on block boundaries
                        tokens_recomputed=prompt - hit_tokens - loaded, evicted_blocks=m.stats["evicted_blocks"],
                        uncached_requests=uncached, seconds=round(seconds, 3), hits=tuple(hits),
                        tiers=tiers.totals if tiers is not None else None)
