"""Cluster replay: a trace over N serving instances behind a router, with or without a shared remote tier.

Each instance has its own CacheManager (device pools of `capacity_tokens`) and, optionally, its own host and
disk tiers (hkv_core.replay.tiers).  A router picks the instance for each request:

- `round-robin`: request i goes to instance i mod N;
- `prefix-aware`: the instance whose cache holds the longest prefix of the request's blocks, as the router
  knows it from the instances' KV events (`take_events`, hkv_core.events; the request's block keys computed with
  the instances' shared key seed); ties go to the instance that was sent the fewest requests.

A shared remote tier (`remote_tokens` > 0) stands for one store all instances write through to and read from
(Mooncake Store in a deployment): every complete block an instance computes is put there (an LRU of
`remote_tokens`, least recent dropped), and after an instance's own hit (device, then its tiers) the blocks
that follow and that the remote tier holds are loaded - every one of them, up to the block holding the prompt's
last token.  Hits are counted as in `replay` (docs/replay.md).
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.block_keys import BlockHasher, keys_bytes
from hkv_core.errors import ConfigError
from hkv_core.events import AllBlocksCleared, BlockRemoved, BlockStored, EventsLost, KVEvent
from hkv_core.manager import CacheManager
from hkv_core.replay.run import ReplayConfig, _serve, manager_for
from hkv_core.replay.tiers import TierReplay
from hkv_core.replay.trace import TraceRequest, check_requests, prompt_of

__all__ = ["ROUTERS", "ClusterConfig", "ClusterResult", "PrefixRouter", "RemoteTier", "cluster_replay"]

ROUTERS = ("round-robin", "prefix-aware")  # how a cluster replay picks the instance for a request


@attrs.frozen(kw_only=True)
class ClusterConfig:
    """`instances` copies of the replay configuration `instance` (its capacities are per instance), a router,
    and a shared remote tier of `remote_tokens` (0: none)."""

    instance: ReplayConfig = attrs.Factory(ReplayConfig)
    instances: int = 1
    router: str = "round-robin"
    remote_tokens: int = 0

    def __attrs_post_init__(self) -> None:
        if self.router not in ROUTERS:
            raise ConfigError(f"unknown router {self.router!r}; the choices: {', '.join(ROUTERS)}",
                              source="replay", key="router")
        if isinstance(self.instances, bool) or not isinstance(self.instances, int) or self.instances < 1:
            raise ConfigError(f"must be an integer >= 1, got {self.instances!r}", source="replay", key="instances")
        if self.remote_tokens < 0:
            raise ConfigError(f"must be >= 0, got {self.remote_tokens}", source="replay", key="remote_tokens")
        if self.instance.policy != "lru":
            raise ConfigError("a cluster replay runs the lru policy", source="replay", key="policy")


@attrs.frozen(kw_only=True)
class ClusterResult:
    """Hit rates of one cluster replay: tokens served from each instance's device and tiers and from the
    remote tier, and how the router spread the requests."""

    instances: int
    router: str
    remote_tokens: int
    capacity_tokens: int | None
    requests: int
    prompt_tokens: int
    tokens_by_source: dict[str, int]  # device, host, disk, remote
    requests_per_instance: tuple[int, ...]
    seconds: float

    @property
    def hit_tokens(self) -> int:
        return sum(self.tokens_by_source.values())

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / max(1, self.prompt_tokens)

    def to_dict(self) -> dict[str, object]:
        out = attrs.asdict(self)
        out.update(hit_tokens=self.hit_tokens, token_hit_rate=round(self.token_hit_rate, 4))
        return out


class RemoteTier:
    """A shared LRU of block ids (the trace's hash ids), `capacity_blocks` of them."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.lru: OrderedDict[int, None] = OrderedDict()

    def serve(self, blocks: Sequence[int], from_block: int, prompt_tokens: int, block_tokens: int) -> int:
        """Blocks from `from_block` on that the tier holds, consecutively, before the prompt's last block."""
        limit, n = min(len(blocks), (prompt_tokens - 1) // block_tokens), 0
        while from_block + n < limit and blocks[from_block + n] in self.lru:
            self.lru.move_to_end(blocks[from_block + n])
            n += 1
        return n

    def store(self, blocks: Sequence[int], complete_blocks: int) -> None:
        """Write through the request's complete blocks, deepest first (a prefix's head ends most recent)."""
        for block in reversed(blocks[:complete_blocks]):
            self.lru[block] = None
            self.lru.move_to_end(block)
        while len(self.lru) > self.capacity:
            self.lru.popitem(last=False)


class PrefixRouter:
    """The instances' cached blocks as their KV events tell them; picks the longest cached prefix."""

    def __init__(self, instances: int, like: CacheManager) -> None:
        self.held: list[set[bytes]] = [set() for _ in range(instances)]
        self.sent = [0] * instances
        # the instances' key function: their shared seed, hash algorithm and layout fingerprint
        self.hasher = BlockHasher(block_tokens=like.layout.block_tokens, seed=like.config.key_seed,
                                  algorithm=like.config.block_hash, namespace=like.layout.fingerprint())

    def hear(self, instance: int, events: Sequence[KVEvent]) -> None:
        held = self.held[instance]
        for event in events:
            if isinstance(event, BlockStored):
                held.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                held.difference_update(event.block_hashes)
            elif isinstance(event, AllBlocksCleared | EventsLost):
                held.clear()  # lost events: what the instance holds is no longer known

    def pick(self, tokens: NDArray[np.int64]) -> int:
        keys = keys_bytes(self.hasher.hash_blocks(tokens))
        depth = [_prefix(keys, held) for held in self.held]
        best = max(range(len(depth)), key=lambda i: (depth[i], -self.sent[i], -i))
        self.sent[best] += 1
        return best


def _prefix(keys: Sequence[bytes], held: set[bytes]) -> int:
    n = 0
    while n < len(keys) and keys[n] in held:
        n += 1
    return n


def cluster_replay(requests: Sequence[TraceRequest], config: ClusterConfig,
                   progress: Callable[[int], None] | None = None) -> ClusterResult:
    """Route and serve every request; `progress(done)` every 100 requests.  ConfigError as `replay`."""
    base = config.instance
    check_requests(requests, base.block_tokens)
    bt, aware = base.block_tokens, config.router == "prefix-aware"
    managers = [manager_for(requests, base, kv_events=aware) for _ in range(config.instances)]
    tiers = [TierReplay(m.layout, base.host_tokens // bt, base.disk_tokens // bt) if base.host_tokens
             or base.disk_tokens else None for m in managers]
    remote = RemoteTier(config.remote_tokens // bt) if config.remote_tokens else None
    router = PrefixRouter(config.instances, managers[0]) if aware else None
    served, sent = Counter[str](), [0] * config.instances
    began = time.perf_counter()
    for done, request in enumerate(requests, 1):
        tokens = prompt_of(request, bt)
        at = router.pick(tokens) if router is not None else (done - 1) % config.instances
        sent[at] += 1
        hit, fitted = _serve(managers[at], tokens, None)
        served["device"] += hit
        if fitted:
            _below(request, hit, tiers[at], remote, served, bt)
        if router is not None:
            router.hear(at, managers[at].take_events())
        if progress is not None and done % 100 == 0:
            progress(done)
    return ClusterResult(instances=config.instances, router=config.router, remote_tokens=config.remote_tokens,
                         capacity_tokens=base.capacity_tokens, requests=len(requests),
                         prompt_tokens=sum(r.input_length for r in requests),
                         tokens_by_source={k: served[k] for k in ("device", "host", "disk", "remote")},
                         requests_per_instance=tuple(sent), seconds=round(time.perf_counter() - began, 3))


def _below(request: TraceRequest, hit: int, tiers: TierReplay | None, remote: RemoteTier | None,
           served: Counter[str], bt: int) -> None:
    """After the device hit: the instance's own tiers, then the remote tier; then write the request's blocks
    through to both."""
    blocks, complete = request.hash_ids, request.input_length // bt
    at = hit // bt
    if tiers is not None:
        before = Counter(tiers.totals.tokens)
        loaded = tiers.serve(blocks, at, request.input_length)
        served.update(tiers.totals.tokens - before)
        at += loaded // bt
        tiers.store(blocks, complete)
    if remote is not None:
        served["remote"] += remote.serve(blocks, at, request.input_length, bt) * bt
        remote.store(blocks, complete)
