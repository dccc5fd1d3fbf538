"""The retention policy: at which block boundaries a request keeps resume points.

A point is kept at every multiple of `retain_every_blocks` blocks, at the
prompt's last block boundary (`retain_prompt_end`) and at its junction
(`retain_junction`: where the prompt leaves the longest chain of cached
blocks, when match found no point there - requests that share a prefix and
then differ, such as a system prompt followed by different questions, will
branch there again), and only where a hit can use it: on a boundary of every
window page (a window page is shared only whole), and with
`allow_partial_page_copy=False` on multiples of the LCM of the prefix pages,
so points elsewhere would hold snapshots and window pages for nothing.
Layouts without window or tail pools keep no points (any block boundary
with its prefix pages is a resume point).
"""

from __future__ import annotations

import bisect
import math

from hkv_core.manager.core import Core
from hkv_core.manager.requests import RequestState


def step_tokens(core: Core) -> int:
    """Distance between periodic points: every `retain_every_blocks` blocks, on hit-able boundaries."""
    every = math.lcm(core.block_tokens * core.config.retain_every_blocks, core.window_lcm_tokens)
    return every if core.config.allow_partial_page_copy else math.lcm(every, core.lcm_tokens)


def usable(core: Core, boundary: int) -> bool:
    """Can a hit end at `boundary` (a block boundary)?  On a boundary of every window page, and with
    `allow_partial_page_copy=False` of every prefix page."""
    return boundary % core.window_lcm_tokens == 0 and (core.config.allow_partial_page_copy
                                                       or boundary % core.lcm_tokens == 0)


def retained_between(core: Core, req: RequestState, start: int, end: int) -> list[int]:
    """Every boundary b with start < b <= end where the request keeps a point, ascending."""
    if not core.needs_points:
        return []
    step = step_tokens(core)
    out = list(range(start // step * step + step, end + 1, step))
    extra = []
    if core.config.retain_prompt_end:
        extra.append(req.prompt_tokens // core.block_tokens * core.block_tokens)
    if core.config.retain_junction:
        extra.append(req.junction_tokens)
    for boundary in set(extra):
        if start < boundary <= end and boundary % step and usable(core, boundary):
            bisect.insort(out, boundary)
    return out
