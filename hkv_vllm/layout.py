"""vLLM's KVCacheConfig as an hkv Layout: vLLM's KV cache groups as hkv layer groups and pools.

vLLM lays a model's layers out in `kv_cache_groups`, each with one
`KVCacheSpec` (block size, KV heads, head size, dtype, window) and one block
table per request; every group draws its block ids from one shared pool of
`num_blocks` (block 0 is vLLM's null block), and one block id is in one group
at a time (the groups share the KV tensors).

The adapter gives each vLLM group one layer of an hkv layout built from the
groups' own geometry (`hkv_core.layout.engine_layout`: full attention, or a
sliding window of the group's size, each with the group's block size, dtype
and KV shape), so groups of one geometry share one hkv pool, with one hkv
page per vLLM block (`tokens_per_page == block_size`).  hkv's block, the
unit it keys and commits, is vLLM's hash block: every group's block is a
whole number of them (a sliding window's exactly one), and hits land where
every group's blocks end (the LCM of the block sizes), as in vLLM.  It splits
vLLM's block ids evenly between the groups: group g holds the ids
`offset[g] + 1 .. offset[g] + share`, and hkv's page p of the group's pool is
vLLM block `offset[g] + p` in that group (hkv's NULL page 0 is vLLM's null
block 0).  A pool shared by k groups has `share` pages; each page is k vLLM
blocks, one per group, which always move together (the groups hold the same
tokens).

Served: full attention (`FullAttentionSpec`, MLA's `MLAAttentionSpec`) and
sliding windows (`SlidingWindowSpec`, MLA's `SlidingWindowMLASpec` without
bounded replay), chunked local attention (as a window of its chunk size), of
any block sizes, KV shapes and dtypes.  Any other spec (Mamba, HiSparse,
cross attention), or a sliding window whose block is more than one hash
block, raise UnsupportedVllmConfig naming the group.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np

from hkv_core.errors import ConfigError
from hkv_core.layout import EngineGroup, Layout, engine_layout
from hkv_vllm.errors import UnsupportedVllmConfig

TORCH_DTYPES = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32"}
PAGE_ALIGNMENT_BYTES = 16  # the smallest hkv accepts: one page is exactly one vLLM block
SERVED_SPECS = ("FullAttentionSpec", "MLAAttentionSpec", "SlidingWindowSpec", "SlidingWindowMLASpec",
                "ChunkedLocalAttentionSpec")


@attrs.frozen(kw_only=True)
class GroupPool:
    """One vLLM KV cache group: its hkv pool, and its vLLM block ids `offset + 1 .. offset + pages`."""

    group_id: int
    pool: str
    block_size: int
    window: int  # the group's sliding window in tokens (0: full attention)
    offset: int
    pages: int

    def block_id(self, page: int) -> int:
        """The vLLM block id of hkv page `page` of the group's pool (0, the null block, for the NULL page)."""
        return self.offset + page if page else 0

    def block_ids(self, pages: Any) -> list[int]:
        """`block_id` of each of `pages` (an array of page ids), in one vectorised step."""
        pages = np.asarray(pages, dtype=np.int64)
        return (np.where(pages > 0, pages + self.offset, 0) if self.offset else pages).tolist()  # type: ignore[no-any-return]


@attrs.frozen(kw_only=True)
class VllmLayout:
    """The hkv Layout of a vLLM KVCacheConfig and where each group's block ids lie."""

    layout: Layout
    groups: tuple[GroupPool, ...]
    num_blocks: int
    block_tokens: int  # hkv's block: vLLM's hash block

    @property
    def pool_pages(self) -> dict[str, int]:
        return {g.pool: g.pages for g in self.groups}

    uniform: bool = attrs.field(init=False)  # every group's block is one hkv block (vLLM's single block size)

    @uniform.default
    def _uniform(self) -> bool:
        return all(g.block_size == self.block_tokens for g in self.groups)


def layout_from_kv_cache_config(kv_cache_config: Any, *, hash_block_size: int | None = None,
                                name: str = "vllm", fine_hits: bool = False) -> VllmLayout:
    """The hkv layout of vLLM's `KVCacheConfig` (UnsupportedVllmConfig for a group hkv does not serve yet).

    hkv's block is vLLM's hash block (`hash_block_size`, default the smallest group block size): every
    group's block size must be a whole number of them, and a sliding-window group's exactly one.  Hits land
    on the LCM of the block sizes, or with `fine_hits` on any hkv block: each must be a whole number of every
    group's `tokens_per_state` (a compressed group's tokens per entry)."""
    specs = [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups]
    if not specs:
        raise UnsupportedVllmConfig(feature="kv_cache_groups", detail="no KV cache group (an attention-free model)")
    windows = [_window(i, spec) for i, spec in enumerate(specs)]
    block = hash_block_size if hash_block_size is not None else min(s.block_size for s in specs)
    engine_groups = [_engine_group(i, spec, windows[i], block) for i, spec in enumerate(specs)]
    _check_states(specs, block if fine_hits else math.lcm(*(s.block_size for s in specs)), fine_hits)
    share = (kv_cache_config.num_blocks - 1) // len(specs)  # block 0 is vLLM's null block, hkv's NULL page
    if share < 1:
        raise UnsupportedVllmConfig(feature="num_blocks",
                                    detail=f"{kv_cache_config.num_blocks} blocks leave none for each of "
                                           f"{len(specs)} groups beside the null block")
    try:
        layout, pools = engine_layout(engine_groups, name=name, block_tokens=block,
                                      alignment_bytes=PAGE_ALIGNMENT_BYTES, source="vLLM KVCacheConfig")
    except ConfigError as exc:  # a geometry hkv's pools cannot hold (what vLLM's names say is checked above)
        raise UnsupportedVllmConfig(feature=f"kv_cache_{exc.key}", detail=str(exc)) from exc
    groups = tuple(GroupPool(group_id=i, pool=pools[i], block_size=spec.block_size, window=windows[i],
                             offset=i * share, pages=share) for i, spec in enumerate(specs))
    return VllmLayout(layout=layout, groups=groups, num_blocks=kv_cache_config.num_blocks, block_tokens=block)


def _check_states(specs: list[Any], hit_unit: int, fine_hits: bool) -> None:
    """Every hit (a multiple of `hit_unit` tokens) ends on a whole entry of every compressed group."""
    for i, spec in enumerate(specs):
        per_state = getattr(spec, "tokens_per_state", 1) or 1
        if hit_unit % per_state:
            raise UnsupportedVllmConfig(feature=f"kv_cache_groups[{i}]",
                                        detail=f"a group of {per_state} tokens per state with hits every "
                                               f"{hit_unit} tokens{' (fine hits)' if fine_hits else ''}: a hit "
                                               f"would end inside a state")


def _engine_group(group_id: int, spec: Any, window: int, block: int) -> EngineGroup:
    """hkv's geometry of one vLLM group: one page per vLLM block."""
    if spec.block_size % block or (window and spec.block_size != block):
        what = "one hash block" if window else "a whole number of hash blocks"
        raise UnsupportedVllmConfig(feature=f"kv_cache_groups[{group_id}]",
                                    detail=f"a {'sliding-window' if window else 'full-attention'} group of "
                                           f"{spec.block_size}-token blocks with {block}-token hash blocks "
                                           f"(hkv needs {what} per block)")
    return EngineGroup(window_tokens=window, tokens_per_page=spec.block_size, kv_dtype=_dtype(spec.dtype),
                       num_kv_heads=spec.num_kv_heads, head_dim=spec.head_size)


def _window(group_id: int, spec: Any) -> int:
    """The group's sliding window (0: full attention); UnsupportedVllmConfig for a spec hkv does not serve.

    A chunked local group (Llama 4's local layers: token p attends to its chunk, from p // C * C) is a window
    of C tokens: the chunk lies within the last C tokens, so the window keeps every block the chunk reads
    (and up to C - 1 tokens more than vLLM keeps).  A full-attention group that the model computes as a
    window or in chunks keeps every block, as vLLM keeps them."""
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, FullAttentionSpec, SlidingWindowSpec

    kind, where = type(spec).__name__, f"kv_cache_groups[{group_id}]"
    if kind not in SERVED_SPECS or not isinstance(spec, FullAttentionSpec | SlidingWindowSpec
                                                  | ChunkedLocalAttentionSpec):
        raise UnsupportedVllmConfig(feature=where, detail=f"a {kind} group (served: {', '.join(SERVED_SPECS)})")
    if isinstance(spec, ChunkedLocalAttentionSpec):
        window = spec.attention_chunk_size
    elif isinstance(spec, SlidingWindowSpec):
        if getattr(spec, "bounded_replay", False):
            raise UnsupportedVllmConfig(feature=where,
                                        detail="a SlidingWindowMLASpec group with bounded replay (vLLM recomputes "
                                               "its window after a hit and rebuilds the compressor state from "
                                               "it; hkv never recomputes a window)")
        window = spec.sliding_window
    else:
        return 0
    if window < 2:
        raise UnsupportedVllmConfig(feature=where, detail=f"a window or chunk of {window} tokens (at least 2)")
    return int(window)


def _dtype(dtype: Any) -> str:
    name = TORCH_DTYPES.get(str(dtype))
    if name is None:
        raise UnsupportedVllmConfig(feature="kv_cache_dtype", detail=f"KV cache dtype {dtype} (served: "
                                                                     f"{', '.join(TORCH_DTYPES.values())})")
    return name
