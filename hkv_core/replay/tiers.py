"""Host and disk tiers in a replay: what the engine's tiers would serve below the device, block by block.

The model follows the engine's tiers (docs/tiers.md) at block granularity:
every complete block a request computes is written through to the host tier
(touched deepest first, so a prefix's head is its most recent block), the
host's least recent blocks move to disk when it is full, and the disk's
least recent are dropped.  At a request, after the device hit, the blocks that
follow it and that a tier holds are the candidates (never the block holding
the prompt's last token); the cost model (hkv_core.tiers.cost) decides how
many to load from the layout's bytes per block against assumed rates of
compute, host and disk.  Loaded tokens are not recomputed; the manager still
allocates and commits them, as the engine does after a load.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence

import attrs

from hkv_core.layout import Layout
from hkv_core.tiers.cost import Candidate, CostModel, LoadDecision, Rate

__all__ = ["TierRates", "TierReplay", "TierTotals"]


@attrs.frozen(kw_only=True)
class TierRates:
    """The rates a replay assumes (no bytes move in a replay): an accelerator's dense compute, a host link and
    a local NVMe drive."""

    compute_flops_per_s: float = 1e15  # about one H200's dense bf16 rate
    host_bytes_per_s: float = 50e9  # PCIe 5 x16, one direction
    host_latency_s: float = 10e-6
    disk_bytes_per_s: float = 5e9  # one NVMe drive
    disk_latency_s: float = 100e-6

    def cost_model(self) -> CostModel:
        return CostModel(compute=Rate(self.compute_flops_per_s, fixed=True),
                         tiers={"host": Rate(self.host_bytes_per_s, self.host_latency_s, fixed=True),
                                "disk": Rate(self.disk_bytes_per_s, self.disk_latency_s, fixed=True)})


@attrs.define
class TierTotals:
    """What the tiers did over a replay."""

    tokens: Counter[str] = attrs.field(factory=Counter)  # prompt tokens loaded, per tier
    bytes: Counter[str] = attrs.field(factory=Counter)  # bytes loaded, per tier
    decisions: Counter[str] = attrs.field(factory=Counter)  # load / split / recompute / none, per request
    moved_to_disk: int = 0
    dropped: int = 0

    def to_dict(self) -> dict[str, object]:
        return {"tokens_loaded": dict(self.tokens), "bytes_loaded": dict(self.bytes),
                "decisions": dict(self.decisions), "moved_to_disk": self.moved_to_disk, "dropped": self.dropped}


class TierReplay:
    """Block ids in a host LRU of `host_blocks` and a disk LRU of `disk_blocks`."""

    def __init__(self, layout: Layout, host_blocks: int, disk_blocks: int, rates: TierRates | None = None) -> None:
        self.layout, self.block = layout, layout.block_tokens
        self.capacity = {"host": host_blocks, "disk": disk_blocks}
        self.lru: dict[str, OrderedDict[int, None]] = {"host": OrderedDict(), "disk": OrderedDict()}
        self.block_bytes = int(sum(spec.bytes_per_token for spec in layout.pools) * self.block)
        self.cost = (rates or TierRates()).cost_model()
        self.totals = TierTotals()

    def where(self, block: int) -> str | None:
        return next((tier for tier, lru in self.lru.items() if block in lru), None)

    def serve(self, blocks: Sequence[int], device_blocks: int, prompt_tokens: int) -> int:
        """Tokens the tiers serve after a device hit of `device_blocks` (the cost model's choice)."""
        limit = (prompt_tokens - 1) // self.block
        candidates = []
        for i in range(device_blocks, min(limit, len(blocks))):
            tier = self.where(blocks[i])
            if tier is None:
                break
            candidates.append(Candidate(lo=i * self.block, hi=(i + 1) * self.block, tokens={tier: self.block},
                                        bytes={tier: self.block_bytes}, records={tier: 1}))
        decision: LoadDecision = self.cost.decide(self.layout, device_blocks * self.block, candidates)
        self.totals.decisions[decision.action] += 1
        for c in candidates[:decision.chosen]:
            for tier, n in c.tokens.items():
                self.totals.tokens[tier] += n
                self.totals.bytes[tier] += c.bytes[tier]
        return decision.loaded_tokens

    def store(self, blocks: Sequence[int], complete_blocks: int) -> None:
        """Write the request's complete blocks through to the host, deepest first (heads end most recent)."""
        for block in reversed(blocks[:complete_blocks]):
            tier = self.where(block)
            if tier is not None:
                self.lru[tier].move_to_end(block)
            elif self.capacity["host"]:
                self.lru["host"][block] = None
                self._spill("host")
            elif self.capacity["disk"]:
                self.lru["disk"][block] = None
                self._spill("disk")

    def _spill(self, tier: str) -> None:
        """Over capacity: the least recent host blocks move to disk, the least recent disk blocks go."""
        lru = self.lru[tier]
        while len(lru) > self.capacity[tier]:
            block, _ = lru.popitem(last=False)
            if tier == "host" and self.capacity["disk"]:
                self.lru["disk"][block] = None
                self.totals.moved_to_disk += 1
                self._spill("disk")
            else:
                self.totals.dropped += 1
