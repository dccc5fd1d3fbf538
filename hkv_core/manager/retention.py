"""The retention policy: at which block boundaries a request keeps resume points.

A point is kept at every multiple of `retain_every_blocks` blocks and at the
prompt's last block boundary (`retain_prompt_end`), and only where a hit can
use it: with `allow_partial_page_copy=False` hits end on multiples of the
LCM of the prefix pages, so points elsewhere would hold snapshots and window
pages for nothing.  Layouts without window or tail pools keep no points (any
block boundary with its prefix pages is a resume point).
"""

from __future__ import annotations

import bisect
import math

from hkv_core.manager.core import Core
from hkv_core.manager.requests import RequestState


def step_tokens(core: Core) -> int:
    """Distance between periodic points: every `retain_every_blocks` blocks, on hit-able boundaries."""
    every = core.block_tokens * core.config.retain_every_blocks
    return every if core.config.allow_partial_page_copy else math.lcm(every, core.lcm_tokens)


def usable(core: Core, boundary: int) -> bool:
    """Can a hit end at `boundary` (a block boundary)?"""
    return core.config.allow_partial_page_copy or boundary % core.lcm_tokens == 0


def retained_between(core: Core, req: RequestState, start: int, end: int) -> list[int]:
    """Every boundary b with start < b <= end where the request keeps a point, ascending."""
    if not core.needs_points:
        return []
    step = step_tokens(core)
    out = list(range(start // step * step + step, end + 1, step))
    prompt_end = req.prompt_tokens // core.block_tokens * core.block_tokens
    if core.config.retain_prompt_end and start < prompt_end <= end and prompt_end % step and usable(core, prompt_end):
        bisect.insort(out, prompt_end)
    return out
