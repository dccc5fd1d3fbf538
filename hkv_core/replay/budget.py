"""A replay's device memory as one budget in bytes, split into the pages of the layout's pools.

A hybrid's cache holds two kinds of thing.  Per-token pages (KV, indexer
keys, compressed entries) grow with the tokens cached.  Point
snapshots (a linear layer's recurrent state, a compressor's tail) take one
page in each snapshot pool per retained resume point, whatever its length:
tens of MB a point for Qwen3-Next.  A capacity in tokens per pool says
nothing about the second, so a comparison at equal memory needs bytes.

`pages_for_budget` first sets aside each pool's NULL page, then gives
`state_share` of the rest to the snapshot pools (the same number of points
in each: a point needs a page in every one) and the remainder to the
per-token pools (the same number of tokens in each).  `demand_share` is the
share a replay uses unless told: the fraction of an unbounded cache's bytes
its snapshots would take on the trace, every distinct complete block and
every distinct retained point of the trace counted once (the manager's
retention rule: a point every `retain_every_blocks` blocks, at each
prompt's last block boundary and where it leaves the blocks cached
before).  docs/replay.md has the rule and its reasons.  Layouts with
sliding-window pools are refused: a window page is held per kept point and
per request, not per token, which this split does not model.
"""

from __future__ import annotations

from collections.abc import Sequence

from hkv_core.errors import ConfigError
from hkv_core.layout import Layout, ObjectKind, PoolSpec
from hkv_core.replay.trace import TraceRequest

__all__ = ["demand_share", "pages_for_budget", "point_bytes", "token_bytes"]


def _pool_bytes(spec: PoolSpec) -> int:
    """One page of the pool over all its layers."""
    return spec.page_bytes * spec.layer_count


def point_bytes(layout: Layout) -> int:
    """Device bytes one retained resume point's snapshots take (0 for a layout that keeps none)."""
    return sum(_pool_bytes(spec) for spec in layout.pools if spec.snapshot)


def token_bytes(layout: Layout) -> float:
    """Device bytes the per-token pools take per cached token, over all their layers."""
    return sum(spec.bytes_per_token for spec in layout.pools if not spec.snapshot)


def pages_for_budget(layout: Layout, memory_bytes: int, state_share: float) -> dict[str, int]:
    """Pages per pool whose device bytes, NULL pages included, stay within `memory_bytes`.  ConfigError when the
    budget cannot hold one page of every per-token pool and one point, or the layout has window pools."""
    windows = [spec.name for spec in layout.pools if spec.object_kind is ObjectKind.SWA_WINDOW]
    if windows:
        raise ConfigError(f"{layout.name}: window pools ({', '.join(windows)}) are held per point and per request, "
                          "which a memory budget does not model yet; give capacity_tokens", source="replay",
                          key="memory_bytes")
    nulls = sum(_pool_bytes(spec) for spec in layout.pools)
    usable = memory_bytes - nulls
    per_point = point_bytes(layout)
    share = state_share if per_point else 0.0
    tokens = int(usable * (1.0 - share) / token_bytes(layout)) if usable > 0 else 0
    points = int(usable * share) // per_point if per_point and usable > 0 else 0
    pages = {spec.name: points if spec.snapshot else tokens // spec.tokens_per_page for spec in layout.pools}
    short = [name for name, n in pages.items() if n < 1]
    if short:
        raise ConfigError(f"{memory_bytes:,} bytes cannot hold one page of {', '.join(short)} (state share "
                          f"{share:.3f}; a point takes {per_point:,} bytes, a token {token_bytes(layout):,.0f})",
                          source="replay", key="memory_bytes")
    return pages


def demand_share(layout: Layout, requests: Sequence[TraceRequest], retain_every_blocks: int) -> float:
    """The snapshots' share of the bytes an unbounded cache would hold for this trace (0 without snapshot
    pools)."""
    per_point = point_bytes(layout)
    if not per_point:
        return 0.0
    bt = layout.block_tokens
    blocks: set[tuple[int, int]] = set()
    points: set[tuple[int, int]] = set()
    for r in requests:
        complete = r.input_length // bt
        ids = r.hash_ids[:complete]
        junction = next((k for k, key in enumerate(enumerate(ids)) if key not in blocks), complete)
        blocks.update(enumerate(ids))
        ends = list(range(retain_every_blocks, complete + 1, retain_every_blocks)) + [complete, junction]
        points.update((end, ids[end - 1]) for end in ends if end)
    state = len(points) * per_point
    return state / (state + len(blocks) * bt * token_bytes(layout))
