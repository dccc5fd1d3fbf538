"""In-kernel prefill checkpoints of Mamba groups (Mamba2, KDA): a state a step leaves before its end.

vLLM's Mamba2 and KDA kernels can write, besides the state at a step's end
(column (end - 1) // T), the state at the last cache boundary before the end
into the column before that one, cdiv(end, T) - 2: a *prefill checkpoint*
(`vllm/model_executor/layers/mamba/checkpoint.py`,
`compute_mamba_prefill_checkpoints`).  The scheduler then need not end a
chunk at the prompt's last block boundary to keep the state there.  The
worker writes a checkpoint wherever vLLM's rule
(`is_mamba_prefill_checkpoint_valid`) holds; vLLM's manager reserves the
column on the steps it keeps one for (every valid step, or with sparse
retention only the step reaching the prefill's end), and the worker writes
the others into the null block.

hkv serves a checkpoint as if the step had also ended there: the adapter
allocates the step in two parts split at the checkpoint, so hkv's state role
takes the checkpoint's column and then the step's last one, and commits the
written tokens in two, so hkv keeps a resume point at the checkpoint on its
column's page.  It does so only where that column is the checkpoint's own
(the state at (k + 1) * T in column k: hkv's point refers to it there) and
not yet the request's; elsewhere the column stays the null block, as the
worker's write goes nowhere a reader looks.  The rule is vLLM's own
functions, so the adapter and the worker decide in lockstep.
"""

from __future__ import annotations

from typing import Any

from hkv_vllm.layout import GroupPool


class Checkpoints:
    """Where a step of a request leaves a prefill checkpoint hkv keeps (0: none)."""

    def __init__(self, states: tuple[GroupPool, ...], hash_block_size: int, cache_hit_alignment_tokens: int,
                 retention_interval: int | None) -> None:
        from vllm.v1.kv_cache_interface import get_mamba_prefill_checkpoint_position, is_mamba_prefill_checkpoint_valid

        self.alignment = states[0].checkpoint_alignment if states else 0  # (`layout._check_checkpoints`: all alike)
        self.block_size = states[0].block_size if states else 0
        self.state_groups = tuple(g.group_id for g in states)
        self.hash_block_size, self.hit_alignment = hash_block_size, cache_hit_alignment_tokens
        self.retention_interval = retention_interval  # vLLM's; 0 (sparse): only the prefill's end keeps one
        self._position, self._valid = get_mamba_prefill_checkpoint_position, is_mamba_prefill_checkpoint_valid

    def at(self, request: Any, blocks: list[list[Any]], start: int, end: int) -> int:
        """The checkpoint of the step computing [start, end) of `request`, whose blocks are `blocks` (per group):
        the position whose state the worker leaves in its own column, which hkv then takes; 0 for none."""
        if not self.alignment or end - start <= self.hash_block_size:  # (decode steps: never one)
            return 0
        if self.retention_interval == 0 and end < max(request.num_prompt_tokens, request.num_tokens - 1):
            return 0
        position = self._position(end, self.hit_alignment, False)
        column = -(-end // self.block_size) - 2
        if (position != (column + 1) * self.block_size or not self._valid(
                query_start=start, query_end=end, checkpoint_position=position, hash_block_size=self.hash_block_size,
                mamba_block_size=self.block_size, checkpoint_alignment=self.alignment)):
            return 0
        return position if all(column >= len(blocks[g]) for g in self.state_groups) else 0
