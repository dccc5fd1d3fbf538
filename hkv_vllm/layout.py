"""vLLM's KVCacheConfig as an hkv Layout: one hkv page pool per vLLM KV cache group.

vLLM lays a model's layers out in `kv_cache_groups`, each with one
`KVCacheSpec` (block size, KV heads, head size, dtype) and one block table
per request; every group draws its block ids from one shared pool of
`num_blocks` (block 0 is vLLM's null block).  The adapter builds an hkv
Layout whose pools are those groups, with one hkv page per vLLM block
(`tokens_per_page == block_size`), and splits vLLM's block ids between the
pools: pool g holds the ids `offset[g] + 1 .. offset[g] + pages[g]`, and hkv's
page p of pool g is vLLM block `offset[g] + p` (hkv's NULL page 0 is vLLM's
null block 0).

Served now: full attention (`FullAttentionSpec`, MLA's `MLAAttentionSpec`)
in one group.  Other specs raise UnsupportedVllmConfig naming the group.
"""

from __future__ import annotations

from typing import Any

import attrs

from hkv_core.layout import Layout
from hkv_vllm.errors import UnsupportedVllmConfig

TORCH_DTYPES = {"torch.float16": "float16", "torch.bfloat16": "bfloat16", "torch.float32": "float32"}
PAGE_ALIGNMENT_BYTES = 16  # the smallest hkv accepts: one page is exactly one vLLM block


@attrs.frozen(kw_only=True)
class GroupPool:
    """One vLLM KV cache group as an hkv pool: its vLLM block ids are `offset + 1 .. offset + pages`."""

    group_id: int
    pool: str
    block_size: int
    offset: int
    pages: int


@attrs.frozen(kw_only=True)
class VllmLayout:
    """The hkv Layout of a vLLM KVCacheConfig and where each group's block ids lie."""

    layout: Layout
    groups: tuple[GroupPool, ...]
    num_blocks: int

    @property
    def pool_pages(self) -> dict[str, int]:
        return {g.pool: g.pages for g in self.groups}


def layout_from_kv_cache_config(kv_cache_config: Any, *, name: str = "vllm") -> VllmLayout:
    """The hkv layout of vLLM's `KVCacheConfig` (UnsupportedVllmConfig for a group hkv does not serve yet)."""
    groups = list(kv_cache_config.kv_cache_groups)
    if len(groups) != 1:
        kinds = ", ".join(type(g.kv_cache_spec).__name__ for g in groups)
        raise UnsupportedVllmConfig(feature="kv_cache_groups",
                                    detail=f"{len(groups)} KV cache groups ({kinds}); one full-attention group "
                                           f"is served")
    spec = groups[0].kv_cache_spec
    _check_full_attention(0, spec)
    layers = max(1, len(groups[0].layer_names))
    config = {
        "model_type": "llama", "torch_dtype": _dtype(spec.dtype), "num_hidden_layers": layers,
        "hidden_size": spec.num_kv_heads * spec.head_size, "num_attention_heads": spec.num_kv_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_size, "vocab_size": 2,
        "hkv": {"block_tokens": spec.block_size, "alignment_bytes": PAGE_ALIGNMENT_BYTES},
    }
    layout = Layout.from_hf_config(config, name=name, source="vLLM KVCacheConfig")
    pool = layout.pools[0]
    assert pool.tokens_per_page == spec.block_size, (pool.tokens_per_page, spec.block_size)
    pages = kv_cache_config.num_blocks - 1  # block 0 is vLLM's null block, hkv's NULL page
    if pages < 1:
        raise UnsupportedVllmConfig(feature="num_blocks",
                                    detail=f"{kv_cache_config.num_blocks} blocks leave none beside the null block")
    group = GroupPool(group_id=0, pool=pool.name, block_size=spec.block_size, offset=0, pages=pages)
    return VllmLayout(layout=layout, groups=(group,), num_blocks=kv_cache_config.num_blocks)


def _check_full_attention(group_id: int, spec: Any) -> None:
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    plain = type(spec).__name__ in ("FullAttentionSpec", "MLAAttentionSpec")
    if not (isinstance(spec, FullAttentionSpec) and plain):
        raise UnsupportedVllmConfig(feature=f"kv_cache_groups[{group_id}]",
                                    detail=f"a {type(spec).__name__} group (full attention is served)")
    if spec.sliding_window is not None or spec.attention_chunk_size is not None:
        raise UnsupportedVllmConfig(feature=f"kv_cache_groups[{group_id}]",
                                    detail="a full-attention group computed as sliding-window or chunked attention")


def _dtype(dtype: Any) -> str:
    name = TORCH_DTYPES.get(str(dtype))
    if name is None:
        raise UnsupportedVllmConfig(feature="kv_cache_dtype", detail=f"KV cache dtype {dtype} (served: "
                                                                     f"{', '.join(TORCH_DTYPES.values())})")
    return name
