"""What serving (or recomputing) one request returns, and how cached tokens are counted."""

from __future__ import annotations

import attrs
import numpy as np

from hkv_core import units
from hkv_core.layout import EntryKind, Layout, ObjectKind, PoolSpec
from hkv_core.layout.kinds import STATE_ENTRIES
from hkv_core.manager import Reason
from hkv_core.tiers.cost import LoadDecision
from hkv_exec_ref.tiny_v4.numerics import F32, I64

TIER_NAMES = ("device", "host", "disk", "remote")  # where a served prefix came from
KINDS = tuple(kind.value for kind in ObjectKind)  # compressed_kv, compressor_tail, swa_window, indexer_state


@attrs.frozen(kw_only=True)
class ServeResult:
    """One request's outputs.

    - `tokens`: the greedily generated ids (max_new_tokens of them).
    - `logits`: (max_new_tokens, vocab), row i the logits token i was chosen from.
    - `prompt_logits`: logits of the prompt positions this request computed,
      [cached_tokens, len(prompt)) (recompute: every prompt position).
    - `cached_tokens`: the hit length P used (0 for recompute).
    - `cached_by_kind`: per object kind, the prefix positions whose state of that
      kind came from the cache at P (largest over that kind's pools).
    - `reasons`: the Hit's reason codes; `reason_details` the full reasons.
    - `proposed_tokens` / `accepted_tokens`: draft tokens of speculative steps.
    - `cached_by_tier`: prompt tokens served from the device hit and loaded
      from the host and disk tiers (they sum to `cached_tokens`).
    - `tier_decision`: the tiers' load / recompute decision (None without tiers).
    """

    tokens: I64
    logits: F32
    prompt_logits: F32
    cached_tokens: int
    cached_by_kind: dict[str, int]
    reasons: tuple[str, ...]
    reason_details: tuple[Reason, ...] = ()
    proposed_tokens: int = 0  # draft tokens speculative steps proposed (generate with a DraftSpec)
    accepted_tokens: int = 0  # of them, accepted by the target
    cached_by_tier: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys(TIER_NAMES, 0))
    tier_decision: LoadDecision | None = None  # with tiers: load / recompute / split, with estimated times
    boundaries: tuple[int, ...] = ()  # HfEngine: where every forward call that built the outputs ended

    def same_outputs(self, other: ServeResult) -> bool:
        """Bit-identical generated tokens and logits (np.array_equal)."""
        return bool(np.array_equal(self.tokens, other.tokens) and np.array_equal(self.logits, other.logits))


def _covered(spec: PoolSpec, layout: Layout, p: int) -> int:
    """Prefix positions < P whose state in this pool is read at a resume point P."""
    if spec.entry_kind is EntryKind.COMPRESSED_ENTRY:
        return p // spec.compress_ratio * spec.compress_ratio
    if spec.entry_kind is EntryKind.WINDOW_ROW:
        return units.window_rows(p, layout.group(spec.group_name).window_tokens)
    if spec.entry_kind in STATE_ENTRIES:
        return p  # a recurrent state summarises every position before P
    return min(p, units.tail_rows(p, spec.compress_ratio))  # rows at negative positions are padding


def cached_by_kind(layout: Layout, p: int) -> dict[str, int]:
    """Per object kind, the positions served from the cache at a hit of P tokens."""
    out = dict.fromkeys((kind.value for kind in layout.object_kinds()), 0)  # the kinds this layout has
    for spec in layout.pools:
        kind = spec.object_kind.value
        out[kind] = max(out[kind], _covered(spec, layout, p))
    return out
