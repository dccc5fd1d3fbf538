"""vLLM's KVCacheConfig as an hkv Layout: vLLM's KV cache groups as hkv layer groups and pools.

vLLM lays a model's layers out in `kv_cache_groups`, each with one
`KVCacheSpec` (block size, KV heads, head size, dtype, window) and one block
table per request; every group draws its block ids from one shared pool of
`num_blocks` (block 0 is vLLM's null block), and one block id is in one group
at a time (the groups share the KV tensors).

The adapter gives each vLLM group one layer of an hkv layout built from the
groups' own geometry (`hkv_core.layout.engine_layout`: full attention, or a
sliding window of the group's size, each with the group's block size, dtype
and KV shape), each group its own hkv pool (`pool_per_group`), with one hkv
page per vLLM block (`tokens_per_page == block_size`).  hkv's block, the
unit it keys and commits, is vLLM's hash block: every group's block is a
whole number of them, and hits land where every group's blocks end (the LCM
of the block sizes), as in vLLM.  The pools share one block space
(`ManagerConfig.shared_pages`), as vLLM's groups share its block pool: hkv's
page p of any pool is vLLM block p (hkv's NULL page 0 is vLLM's null block
0), a block is one group's at a time, and each group takes blocks when it
needs them - nothing is split between the groups.

Served: full attention (`FullAttentionSpec`, MLA's `MLAAttentionSpec`) and
sliding windows (`SlidingWindowSpec`, MLA's `SlidingWindowMLASpec` without
bounded replay: DeepSeek-V4's window and compressor-state groups), chunked
local attention (as a window of its chunk size), of any block sizes, KV
shapes and dtypes (an fp8 cache's bytes as `fp8`), and Mamba / Gated DeltaNet
state groups (`MambaSpec`) as hkv state columns (one page per block column,
a resume point where a step ended on a block boundary or where the kernel
exported a prefill checkpoint, and with vLLM's sub-block hits (a Mamba block
of several hash blocks) inside a block too: `hkv_core/manager/roles/state.py`,
docs/vllm_mamba.md), without speculative state blocks.  Any other spec (HiSparse,
cross attention) raises UnsupportedVllmConfig naming the group.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np

from hkv_core.errors import ConfigError
from hkv_core.layout import EngineGroup, Layout, engine_layout
from hkv_vllm.errors import UnsupportedVllmConfig

TORCH_DTYPES = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32",
                "torch.uint8": "fp8", "torch.float8_e4m3fn": "fp8"}  # an fp8 cache: bytes hkv never reads
PAGE_ALIGNMENT_BYTES = 16  # the smallest hkv accepts: one page is exactly one vLLM block
SERVED_SPECS = ("FullAttentionSpec", "MLAAttentionSpec", "SlidingWindowSpec", "SlidingWindowMLASpec",
                "ChunkedLocalAttentionSpec", "CircularBufferSpec", "MambaSpec")
REPLAY_SETTING = "--no-swa-bounded-replay"  # vLLM's CacheConfig.swa_bounded_replay=False: V4.1's window cached


@attrs.frozen(kw_only=True)
class GroupPool:
    """One vLLM KV cache group and its hkv pool, whose page p is vLLM block p (one shared block space)."""

    group_id: int
    pool: str
    block_size: int
    window: int  # the group's sliding window in tokens (0: full attention)
    ring: bool = False  # a CircularBufferSpec ring: one block per request for its life (hkv's scratch role)
    state: bool = False  # a MambaSpec group: one block per column, the state at a step's end (hkv's state role)
    checkpoint_alignment: int = 0  # a MambaSpec group whose kernel exports in-kernel prefill checkpoints (0: none)

    @property
    def sliding(self) -> bool:
        """Whether hkv releases the group's early blocks while the request runs (a window, or state columns)."""
        return bool(self.window) or self.state

    def new_blocks(self, tokens: int, have: int, cap: int = 1 << 62) -> int:
        """The blocks the group takes to cover `tokens` tokens when the request has `have` (at most `cap` held by
        a window): state columns take one, for the column of the last token, whatever the columns before."""
        need = max(0, min(self.blocks_for(tokens), cap) - have)
        return min(need, 1) if self.state else need

    def blocks_for(self, tokens: int) -> int:
        """The blocks of the group that cover `tokens` tokens (a ring: its one block)."""
        return 1 if self.ring else -(-tokens // self.block_size)

    @staticmethod
    def block_id(page: int) -> int:
        """The vLLM block id of hkv page `page` (0, the null block, for the NULL page)."""
        return page

    @staticmethod
    def block_ids(pages: Any) -> list[int]:
        """`block_id` of each of `pages` (an array of page ids)."""
        return np.asarray(pages, dtype=np.int64).tolist()  # type: ignore[no-any-return]


@attrs.frozen(kw_only=True)
class VllmLayout:
    """The hkv Layout of a vLLM KVCacheConfig, its groups' pools and the block space they share."""

    layout: Layout
    groups: tuple[GroupPool, ...]
    num_blocks: int
    block_tokens: int  # hkv's block: vLLM's hash block

    @property
    def shared_pages(self) -> int:
        """The blocks every group draws from: vLLM's, less the null block (hkv's NULL page)."""
        return self.num_blocks - 1

    uniform: bool = attrs.field(init=False)  # every group's block is one hkv block (vLLM's single block size)

    @uniform.default
    def _uniform(self) -> bool:
        return all(g.block_size == self.block_tokens for g in self.groups)


def layout_from_kv_cache_config(kv_cache_config: Any, *, hash_block_size: int | None = None,
                                name: str = "vllm", fine_hits: bool = False) -> VllmLayout:
    """The hkv layout of vLLM's `KVCacheConfig` (UnsupportedVllmConfig for a group hkv does not serve yet).

    hkv's block is vLLM's hash block (`hash_block_size`, default the smallest group block size): every
    group's block size must be a whole number of them.  Hits land on the LCM of the block sizes, or with
    `fine_hits` on any hkv block, which no compressed group allows (`tokens_per_state` > 1: a packed group's
    spec names one of its layers' compression, DeepSeek-V4's groups mix entries of 4 and 128 tokens)."""
    specs = [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups]
    if not specs:
        raise UnsupportedVllmConfig(feature="kv_cache_groups", detail="no KV cache group (an attention-free model)")
    windows = [_window(i, spec) for i, spec in enumerate(specs)]
    rings = [type(spec).__name__ == "CircularBufferSpec" for spec in specs]
    states = [type(spec).__name__ == "MambaSpec" for spec in specs]
    block = hash_block_size if hash_block_size is not None else min(
        s.block_size for s, ring in zip(specs, rings, strict=True) if not ring)
    if fine_hits and any(s.block_size != block for s, state in zip(specs, states, strict=True) if state):
        raise UnsupportedVllmConfig(feature="mamba_fine_hits", detail=f"hkv's fine hits ({block}-token blocks) with "
                                    f"a Mamba group of larger blocks (vLLM's own sub-block hits are served: its "
                                    f"hash block finer than the Mamba block, without fine_hits)")
    engine_groups = [_engine_group(i, spec, windows[i], block, rings[i], states[i]) for i, spec in enumerate(specs)]
    _check_states(specs, block if fine_hits else math.lcm(*(s.block_size for s in specs)), fine_hits)
    if kv_cache_config.num_blocks < 2:  # block 0 is vLLM's null block, hkv's NULL page
        raise UnsupportedVllmConfig(feature="num_blocks",
                                    detail=f"{kv_cache_config.num_blocks} blocks leave none beside the null block")
    try:
        layout, pools = engine_layout(engine_groups, name=name, block_tokens=block, pool_per_group=True,
                                      alignment_bytes=PAGE_ALIGNMENT_BYTES, source="vLLM KVCacheConfig")
    except ConfigError as exc:  # a geometry hkv's pools cannot hold (what vLLM's names say is checked above)
        raise UnsupportedVllmConfig(feature=f"kv_cache_{exc.key}", detail=str(exc)) from exc
    groups = tuple(GroupPool(group_id=i, pool=pools[i], block_size=spec.block_size, window=windows[i],
                             ring=rings[i], state=states[i],
                             checkpoint_alignment=_checkpoints(spec) if states[i] else 0)
                   for i, spec in enumerate(specs))
    _check_checkpoints([g for g in groups if g.state])
    return VllmLayout(layout=layout, groups=groups, num_blocks=kv_cache_config.num_blocks, block_tokens=block)


def _check_states(specs: list[Any], hit_unit: int, fine_hits: bool) -> None:
    """Every hit (a multiple of `hit_unit` tokens) ends on a whole entry of every compressed group; with fine
    hits, no group is compressed (a packed group's spec names only one of its layers' compression)."""
    for i, spec in enumerate(specs):
        per_state = max(1, getattr(spec, "tokens_per_state", 1) or 1)  # (a MambaSpec's is -1: none)
        if hit_unit % per_state or (fine_hits and per_state > 1):
            raise UnsupportedVllmConfig(feature=f"kv_cache_groups[{i}]",
                                        detail=f"a group of {per_state} tokens per state with hits every "
                                               f"{hit_unit} tokens{' (fine hits)' if fine_hits else ''}: a hit "
                                               f"could end inside a state")


def _engine_group(group_id: int, spec: Any, window: int, block: int, ring: bool, state: bool) -> EngineGroup:
    """hkv's geometry of one vLLM group: one page per vLLM block (a ring's need not be whole hash blocks: it is
    never keyed; a state group's page is its state, `_state_group`)."""
    if state:
        return _state_group(group_id, spec, block)
    if spec.block_size % block and not ring:
        raise UnsupportedVllmConfig(feature=f"kv_cache_groups[{group_id}]",
                                    detail=f"a {'sliding-window' if window else 'full-attention'} group of "
                                           f"{spec.block_size}-token blocks with {block}-token hash blocks "
                                           f"(hkv needs a whole number of hash blocks per block)")
    return EngineGroup(window_tokens=window, tokens_per_page=spec.block_size, kv_dtype=_dtype(spec.dtype),
                       num_kv_heads=spec.num_kv_heads, head_dim=spec.head_size, ring=ring)


def _state_group(group_id: int, spec: Any, block: int) -> EngineGroup:
    """A MambaSpec group as hkv state columns, its page of the group's bytes (UnsupportedVllmConfig for what hkv does
    not serve yet: speculative state blocks)."""
    where = f"kv_cache_groups[{group_id}]"
    if spec.num_speculative_blocks:
        raise UnsupportedVllmConfig(feature="mamba_speculative_blocks",
                                    detail=f"{where}: speculative decoding over a Mamba group, "
                                           f"{spec.num_speculative_blocks} block(s) per request")
    if spec.block_size % block:
        raise UnsupportedVllmConfig(feature=where, detail=f"a Mamba group of {spec.block_size}-token blocks with "
                                                          f"{block}-token hash blocks (a whole number of them)")
    try:  # (the page's bytes size hkv's report only; vLLM itself reads them only when it plans memory)
        page_bytes = int(spec.page_size_bytes)
    except (TypeError, ValueError):  # shapes vLLM cannot size (its tests' placeholder specs)
        page_bytes = 0
    per_token = max(1, -(-page_bytes // (spec.block_size * 2 * 4)))  # fp32 pairs per token covering the page
    return EngineGroup(window_tokens=0, tokens_per_page=spec.block_size, kv_dtype="fp32", num_kv_heads=1,
                       head_dim=per_token, state=True)


def _checkpoints(spec: Any) -> int:
    """The alignment of a Mamba group's in-kernel prefill checkpoints (Mamba2, KDA: vLLM's
    `num_prefill_checkpoint_blocks`, `prefill_checkpoint_alignment`); 0 where its kernel exports none."""
    alignment = getattr(spec, "prefill_checkpoint_alignment", None)
    return int(alignment) if getattr(spec, "num_prefill_checkpoint_blocks", 0) and alignment else 0


def _check_checkpoints(states: list[GroupPool]) -> None:
    """The Mamba groups agree on their blocks and checkpoints: a step's checkpoint is one column of them all
    (vLLM's scheduler, too, splits chunks for all of them alike)."""
    if len({(g.block_size, g.checkpoint_alignment) for g in states}) > 1:
        found = ", ".join(f"kv_cache_groups[{g.group_id}]: {g.block_size}-token blocks, checkpoints "
                          f"{g.checkpoint_alignment or 'none'}" for g in states)
        raise UnsupportedVllmConfig(feature="mamba_mixed_checkpoints",
                                    detail=f"Mamba groups with different blocks or prefill checkpoints ({found})")


def _window(group_id: int, spec: Any) -> int:
    """The group's sliding window (0: full attention); UnsupportedVllmConfig for a spec hkv does not serve.

    A chunked local group (Llama 4's local layers: token p attends to its chunk, from p // C * C) is a window
    of C tokens: the chunk lies within the last C tokens, so the window keeps every block the chunk reads
    (and up to C - 1 tokens more than vLLM keeps).  A full-attention group that the model computes as a
    window or in chunks keeps every block, as vLLM keeps them."""
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        CircularBufferSpec,
        FullAttentionSpec,
        MambaSpec,
        SlidingWindowSpec,
    )

    kind, where = type(spec).__name__, f"kv_cache_groups[{group_id}]"
    if kind not in SERVED_SPECS or not isinstance(spec, FullAttentionSpec | SlidingWindowSpec
                                                  | ChunkedLocalAttentionSpec | CircularBufferSpec | MambaSpec):
        raise UnsupportedVllmConfig(feature=where, detail=f"a {kind} group (served: {', '.join(SERVED_SPECS)})")
    if isinstance(spec, MambaSpec):
        return 0
    if isinstance(spec, ChunkedLocalAttentionSpec):
        window = spec.attention_chunk_size
    elif isinstance(spec, SlidingWindowSpec):
        if getattr(spec, "bounded_replay", False):
            raise UnsupportedVllmConfig(
                feature="swa_bounded_replay",
                detail=f"{where}: a sliding window with bounded replay (DeepSeek-V4.1: after a hit vLLM recomputes "
                       f"the last {spec.sliding_window} tokens, which its own code calls not bit-identical to a "
                       f"full prefill, and keeps the window out of prefix caching; a manager cannot opt out).  "
                       f"hkv serves V4.1 exactly with the window cached instead: start vLLM with "
                       f"{REPLAY_SETTING} (CacheConfig.swa_bounded_replay=False)")
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
