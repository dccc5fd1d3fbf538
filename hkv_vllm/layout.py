"""vLLM's KVCacheConfig as an hkv Layout: vLLM's KV cache groups as hkv layer groups and pools.

vLLM lays a model's layers out in `kv_cache_groups`, each with one
`KVCacheSpec` (block size, KV heads, head size, dtype, window) and one block
table per request; every group draws its block ids from one shared pool of
`num_blocks` (block 0 is vLLM's null block), and one block id is in one group
at a time (the groups share the KV tensors).

The adapter gives each vLLM group one layer of an hkv `gpt_oss`-style layout
(`Layout.from_layer_windows`: full attention, or a sliding window of the
group's size), so groups of one spec share one hkv pool, with one hkv page
per vLLM block (`tokens_per_page == block_size`).  It splits vLLM's block ids
evenly between the groups: group g holds the ids `offset[g] + 1 ..
offset[g] + share`, and hkv's page p of the group's pool is vLLM block
`offset[g] + p` in that group (hkv's NULL page 0 is vLLM's null block 0).  A
pool shared by k groups has `share` pages; each page is k vLLM blocks, one
per group, which always move together (the groups hold the same tokens).

Served: full attention (`FullAttentionSpec`, MLA's `MLAAttentionSpec`) and
sliding windows (`SlidingWindowSpec`, MLA's `SlidingWindowMLASpec` without
bounded replay), one block size and one KV shape and
dtype for all groups.  Any other spec (Mamba, chunked local, cross
attention, DeepSeek-V4's compressed groups), or groups differing in block
size or shape, raise UnsupportedVllmConfig naming the group.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from hkv_core.layout import Layout
from hkv_vllm.errors import UnsupportedVllmConfig

TORCH_DTYPES = {"torch.float16": "float16", "torch.bfloat16": "bfloat16", "torch.float32": "float32"}
PAGE_ALIGNMENT_BYTES = 16  # the smallest hkv accepts: one page is exactly one vLLM block
SERVED_SPECS = ("FullAttentionSpec", "MLAAttentionSpec", "SlidingWindowSpec", "SlidingWindowMLASpec")


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

    @property
    def pool_pages(self) -> dict[str, int]:
        return {g.pool: g.pages for g in self.groups}

    @property
    def block_size(self) -> int:
        return self.groups[0].block_size


def layout_from_kv_cache_config(kv_cache_config: Any, *, name: str = "vllm") -> VllmLayout:
    """The hkv layout of vLLM's `KVCacheConfig` (UnsupportedVllmConfig for a group hkv does not serve yet)."""
    specs = [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups]
    if not specs:
        raise UnsupportedVllmConfig(feature="kv_cache_groups", detail="no KV cache group (an attention-free model)")
    windows = [_window(i, spec) for i, spec in enumerate(specs)]
    _check_uniform(specs)
    share = (kv_cache_config.num_blocks - 1) // len(specs)  # block 0 is vLLM's null block, hkv's NULL page
    if share < 1:
        raise UnsupportedVllmConfig(feature="num_blocks",
                                    detail=f"{kv_cache_config.num_blocks} blocks leave none for each of "
                                           f"{len(specs)} groups beside the null block")
    layout = Layout.from_layer_windows(_config(specs[0], windows), windows, name=name, source="vLLM KVCacheConfig")
    pools = []
    for layer in range(len(windows)):
        (pool,) = layout.pools_of(layout.group_of_layer(layer).name)
        assert pool.tokens_per_page == specs[0].block_size, (pool.tokens_per_page, specs[0].block_size)
        pools.append(pool.name)
    groups = tuple(GroupPool(group_id=i, pool=pools[i], block_size=specs[0].block_size, window=windows[i],
                             offset=i * share, pages=share) for i in range(len(specs)))
    return VllmLayout(layout=layout, groups=groups, num_blocks=kv_cache_config.num_blocks)


def _config(spec: Any, windows: list[int]) -> dict[str, Any]:
    """A gpt_oss-style config with one layer per vLLM group."""
    sliding = [w for w in windows if w]
    config: dict[str, Any] = {
        "model_type": "gpt_oss", "torch_dtype": _dtype(spec.dtype), "num_hidden_layers": len(windows),
        "hidden_size": spec.num_kv_heads * spec.head_size, "num_attention_heads": spec.num_kv_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_size, "vocab_size": 2,
        "layer_types": ["sliding_attention" if w else "full_attention" for w in windows],
        "hkv": {"block_tokens": spec.block_size, "alignment_bytes": PAGE_ALIGNMENT_BYTES},
    }
    if sliding:
        config["sliding_window"] = max(sliding)
    return config


def _window(group_id: int, spec: Any) -> int:
    """The group's sliding window (0: full attention); UnsupportedVllmConfig for a spec hkv does not serve."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    kind = type(spec).__name__
    if kind not in SERVED_SPECS or not isinstance(spec, FullAttentionSpec | SlidingWindowSpec):
        raise UnsupportedVllmConfig(feature=f"kv_cache_groups[{group_id}]",
                                    detail=f"a {kind} group (served: {', '.join(SERVED_SPECS)})")
    if isinstance(spec, SlidingWindowSpec):
        if getattr(spec, "bounded_replay", False):
            raise UnsupportedVllmConfig(feature=f"kv_cache_groups[{group_id}]",
                                        detail="a SlidingWindowMLASpec group with bounded replay (vLLM recomputes "
                                               "its window after a hit and rebuilds the compressor state from "
                                               "it; hkv never recomputes a window)")
        if spec.sliding_window < 2:
            raise UnsupportedVllmConfig(feature=f"kv_cache_groups[{group_id}]",
                                        detail=f"a sliding window of {spec.sliding_window} tokens (at least 2)")
        return int(spec.sliding_window)
    if spec.sliding_window is not None or spec.attention_chunk_size is not None:
        raise UnsupportedVllmConfig(feature=f"kv_cache_groups[{group_id}]",
                                    detail="a full-attention group computed as sliding-window or chunked attention")
    return 0


def _check_uniform(specs: list[Any]) -> None:
    """One block size, KV shape and dtype for every group (what one hkv layout of equal pages needs)."""
    first = specs[0]
    for i, spec in enumerate(specs[1:], start=1):
        for field in ("block_size", "num_kv_heads", "head_size", "dtype"):
            if getattr(spec, field) != getattr(first, field):
                raise UnsupportedVllmConfig(feature=f"kv_cache_groups[{i}]",
                                            detail=f"{field} {getattr(spec, field)} differs from group 0's "
                                                   f"{getattr(first, field)} (one {field} for every group "
                                                   f"is served)")


def _dtype(dtype: Any) -> str:
    name = TORCH_DTYPES.get(str(dtype))
    if name is None:
        raise UnsupportedVllmConfig(feature="kv_cache_dtype", detail=f"KV cache dtype {dtype} (served: "
                                                                     f"{', '.join(TORCH_DTYPES.values())})")
    return name
