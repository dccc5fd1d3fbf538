"""Small engine-laid-out layouts (vLLM's KV cache groups as hkv layouts) for the state machines and checkers.

`ENGINE_LAYOUTS[name]` is (hkv block tokens, the engine's groups); `engine_test_layout(name)` builds the
layout with `hkv_core.layout.engine_layout`.  `v4_in_vllm` is DeepSeek-V4 as vLLM lays it out, shrunk:
a full-attention (MLA) group of 32-token pages, two sliding-window groups of 8-token pages (two 4-token
blocks each) with a 16-token window, a compressor-state group of 4-token pages with an 8-token window and
one of 8-token pages with a 32-token window, over 4-token hash blocks (vLLM: 256, 64 / 128, 4 / 8, 8 / 128
over 4); `v41_in_vllm` is V4.1 without bounded replay (windows, MLA and the compressor's ring), shrunk.
"""

from __future__ import annotations

from hkv_core.layout import EngineGroup, Layout, engine_layout


def _group(window: int, page: int, ring: bool = False) -> EngineGroup:
    return EngineGroup(window_tokens=window, tokens_per_page=page, kv_dtype="fp16", num_kv_heads=1, head_dim=8,
                       ring=ring)


ENGINE_LAYOUTS: dict[str, tuple[int, tuple[EngineGroup, ...]]] = {
    "v4_in_vllm": (4, (_group(0, 32), _group(16, 8), _group(16, 8), _group(8, 4), _group(32, 8))),
    # DeepSeek-V4.1 without bounded replay, shrunk: windows in pages of one block, MLA in pages of two, and
    # the compressor's ring (one page per request, smaller than a block)
    "v41_in_vllm": (4, (_group(16, 4), _group(16, 4), _group(0, 8), _group(0, 2, ring=True))),
    "swa_pages_of_two_blocks": (4, (_group(0, 8), _group(12, 8))),
}


def engine_test_layout(name: str, *, pool_per_group: bool = False) -> tuple[Layout, tuple[str, ...]]:
    """The layout of `ENGINE_LAYOUTS[name]` and each group's pool (KeyError for an unknown name)."""
    block, groups = ENGINE_LAYOUTS[name]
    return engine_layout(groups, name=name, block_tokens=block, alignment_bytes=16, source="engine test layout",
                         pool_per_group=pool_per_group)
