"""The retention policy: at which block boundaries a request keeps resume points.

A point is kept at every multiple of `retain_every_blocks` blocks, at the
prompt's last boundary a hit can end on (`retain_prompt_end`) and at its
junction's (`retain_junction`: where the prompt leaves the longest chain of
cached blocks, when match found no point there - requests that share a
prefix and then differ, such as a system prompt followed by different
questions, will branch there again), and only where a hit can use it: on a boundary of every
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


def hit_unit(core: Core) -> int:
    """Tokens between the boundaries a hit can end on: a block, on a boundary of every window page, and with
    `allow_partial_page_copy=False` of every prefix page."""
    unit = math.lcm(core.block_tokens, core.window_lcm_tokens)
    return unit if core.config.allow_partial_page_copy else math.lcm(unit, core.lcm_tokens)


def step_tokens(core: Core) -> int:
    """Distance between periodic points: every `retain_every_blocks` blocks, on hit-able boundaries."""
    return math.lcm(core.block_tokens * core.config.retain_every_blocks, hit_unit(core))


def anchors(core: Core, req: RequestState) -> tuple[int, int]:
    """Where the request keeps points others resume at: the last boundary a hit can end on at or before its
    prompt's end, and at or before its junction (0: none)."""
    unit = hit_unit(core)
    return req.prompt_tokens // unit * unit, req.junction_tokens // unit * unit


def retained_between(core: Core, req: RequestState, start: int, end: int) -> list[int]:
    """Every boundary b with start < b <= end where the request keeps a point, ascending."""
    if not core.needs_points:
        return []
    step = step_tokens(core)
    out = list(range(start // step * step + step, end + 1, step))
    prompt_end, junction = anchors(core, req)
    extra = {prompt_end if core.config.retain_prompt_end else 0, junction if core.config.retain_junction else 0}
    for boundary in extra:
        if start < boundary <= end and boundary % step:
            bisect.insort(out, boundary)
    return out
