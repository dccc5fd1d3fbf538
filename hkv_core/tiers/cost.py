"""Load or recompute: the cost model behind a tier hit's decision (docs/tiers.md, F16).

Recomputing tokens [lo, hi) costs their FLOPs over a compute rate; loading the
block records that hold them costs, per record, a latency plus its bytes over
the tier's bandwidth.  Both rates are estimates that every measured load or
forward pass updates (an exponential moving average), so the decision follows
the machine it runs on.  A request's candidates are the records of consecutive
blocks after its device hit; the decision loads the prefix of them that saves
the most time: all (load), none (recompute), or a head (split: the head is
loaded, the rest recomputed after it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from hkv_core.errors import InvalidArgument
from hkv_core.layout import Layout

__all__ = ["DECISIONS", "POLICIES", "Candidate", "CostModel", "LoadDecision", "Rate", "recompute_flops"]

POLICIES = ("cost", "load", "recompute")  # cost: the model decides; load / recompute: forced (tests, tools)
DECISIONS = ("none", "load", "recompute", "split")  # none: no tier holds the next block
SMOOTHING = 0.2  # weight of a new measurement in a rate's moving average
FFN_FLOPS_PER_HIDDEN_SQ = 16  # a dense MLP of 4x width: 2 matmuls of 4 h^2 multiply-adds each


@attrs.define
class Rate:
    """A rate with a moving average: `value` units per second, `latency_s` per operation (loads)."""

    value: float
    latency_s: float = 0.0
    measured: int = 0  # measurements folded in
    fixed: bool = False  # given by the user: measurements do not move it

    def observe(self, units: float, seconds: float) -> None:
        """Fold one measurement (`units` done in `seconds`, latency included) into the average."""
        if units <= 0 or seconds <= 0 or self.fixed:
            return
        rate = units / max(seconds - self.latency_s, seconds / 2)
        self.value = rate if not self.measured else (1 - SMOOTHING) * self.value + SMOOTHING * rate
        self.measured += 1

    def seconds(self, units: float, operations: int = 1) -> float:
        return operations * self.latency_s + units / self.value


def recompute_flops(layout: Layout, lo: int, hi: int) -> float:
    """FLOPs to run tokens [lo, hi) through the main layers: the q/k/v/o projections and an MLP per token, and
    attention over what each token sees - every earlier token (full attention), the window's rows, the
    compressed entries (CSA: the indexer's top-k of them, plus the indexer scoring them all; DeepSeek-V3.2: the
    indexer's top-k of every earlier token, plus its scoring; a linear layer: its state update, the same at
    every position).  An estimate:
    the layout does not say the MLP's width."""
    tokens = hi - lo
    if tokens <= 0:
        return 0.0
    h, heads, d = layout.hidden_size, layout.num_attention_heads, layout.head_dim
    dense = 2.0 * 4 * h * heads * d + FFN_FLOPS_PER_HIDDEN_SQ * h * h
    position = (lo + hi - 1) / 2 + 1  # the mean number of tokens a token of the range sees, itself included
    flops = 0.0
    for group in layout.groups:
        if group.state is not None:  # a linear layer: a fixed-size state update per token, whatever it follows
            update = 6.0 * math.prod(group.state.ssm_shape) + 2.0 * math.prod(group.state.conv_shape)
            flops += len(group.layer_ids) * (dense + update)
            continue
        window = min(position, group.window_tokens) if group.window_tokens else 0.0
        scoring = 0.0
        if group.compress_ratio <= 1 and group.has_indexer:  # full attention made sparse (DeepSeek-V3.2)
            seen = min(position, group.index_topk)
            scoring = 2.0 * group.index_n_heads * group.index_head_dim * position
        elif group.compress_ratio <= 1:  # 0: sliding window only, 1: full attention
            seen = window or position  # a sliding window, or full attention
        else:
            entries = position / group.compress_ratio
            seen = window + (min(entries, group.index_topk) if group.index_topk else entries)
            scoring = 2.0 * group.index_n_heads * group.index_head_dim * entries if group.index_topk else 0.0
        flops += len(group.layer_ids) * (dense + 4.0 * heads * d * seen + scoring)
    return flops * tokens


@attrs.frozen(kw_only=True)
class Candidate:
    """Tokens [lo, hi) after the device hit that the tiers can serve, ending at a resume point they hold:
    per tier, the tokens its records hold, the payload bytes and the records a load reads."""

    lo: int
    hi: int
    tokens: dict[str, int]
    bytes: dict[str, int]
    records: dict[str, int]


@attrs.frozen(kw_only=True)
class LoadDecision:
    """What a request does with the tiers' records: part of its hit verdict.

    `action` is one of DECISIONS; `load_tokens` the tokens it loads per tier;
    `load_s` / `recompute_s` the estimated seconds to load the chosen records and
    to recompute the same tokens instead; `candidate_tokens` what the tiers held.
    """

    action: str
    policy: str
    chosen: int  # candidates loaded (a prefix of them)
    device_tokens: int
    candidate_tokens: int
    load_tokens: dict[str, int]
    load_s: float
    recompute_s: float

    @property
    def loaded_tokens(self) -> int:
        return sum(self.load_tokens.values())


@attrs.define
class CostModel:
    """Rates of compute (FLOPs per second) and of each tier (bytes per second, latency per record)."""

    compute: Rate
    tiers: dict[str, Rate]
    policy: str = "cost"

    def __attrs_post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise InvalidArgument(action="CostModel", argument="policy", value=self.policy,
                                  reason=f"must be one of {', '.join(POLICIES)}")

    def decide(self, layout: Layout, device_tokens: int, candidates: Sequence[Candidate]) -> LoadDecision:
        """Load the prefix of `candidates` (consecutive, from the device hit) that saves the most time."""
        saving, best, best_at = 0.0, 0.0, 0
        for i, c in enumerate(candidates):
            saving += self._recompute_s(layout, c.lo, c.hi) - self._load_s(c)
            if saving > best:
                best, best_at = saving, i + 1
        if self.policy != "cost":
            best_at = len(candidates) if self.policy == "load" else 0
        chosen = candidates[:best_at]
        load_tokens = dict.fromkeys(self.tiers, 0)
        for c in chosen:
            for tier, n in c.tokens.items():
                load_tokens[tier] += n
        action = ("none" if not candidates else "recompute" if not chosen
                  else "load" if len(chosen) == len(candidates) else "split")
        return LoadDecision(action=action, policy=self.policy, chosen=len(chosen), device_tokens=device_tokens,
                            candidate_tokens=sum(c.hi - c.lo for c in candidates), load_tokens=load_tokens,
                            load_s=sum(self._load_s(c) for c in chosen),
                            recompute_s=sum(self._recompute_s(layout, c.lo, c.hi) for c in chosen))

    def _load_s(self, c: Candidate) -> float:
        return sum(self.tiers[tier].seconds(c.bytes[tier], c.records[tier]) for tier in c.bytes)

    def _recompute_s(self, layout: Layout, lo: int, hi: int) -> float:
        return self.compute.seconds(recompute_flops(layout, lo, hi), 0)
