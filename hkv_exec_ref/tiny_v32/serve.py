"""V32Server: TinyV32 served through a CacheManager and a RefExecutor (the latent and the indexer keys per pool).

`prefill` matches and acquires a hit, allocates the rest in chunks (running each allocation's copy plan: a hit
ending inside a page copies each kind's partial page), reads the latents and indexer keys of [0, P) through the
two pools' block tables, computes, writes every new row of both kinds into its slot and commits.  The oracle is
`np.array_equal` with `TinyV32.recompute`.  `drop_indexer_keys=True` is a broken variant (tests only): the
indexer keys a hit reads are zeros, as if they had not been kept (docs/failures.md, F4).
"""

from __future__ import annotations

import attrs
import numpy as np

from hkv_core.layout import ObjectKind, PoolSpec
from hkv_core.manager import Allocation, CacheManager
from hkv_exec_ref.engine.state_io import read_rows
from hkv_exec_ref.executor import RefExecutor
from hkv_exec_ref.tiny_v4.numerics import F32
from hkv_exec_ref.tiny_v32.model import TinyV32, Tokens, V32State


@attrs.frozen(kw_only=True)
class V32Served:
    """One prompt served: its cached tokens, the logits of the positions it computed, the hit's reason codes."""

    cached_tokens: int
    logits: F32  # (len(prompt) - cached_tokens, vocab)
    reasons: tuple[str, ...]


class V32Server:
    """Serves TinyV32 from the pools of `manager` (bound to `executor` here)."""

    def __init__(self, model: TinyV32, manager: CacheManager, executor: RefExecutor, *,
                 drop_indexer_keys: bool = False) -> None:
        self.model, self.manager, self.executor = model, manager, executor
        self.drop_indexer_keys = drop_indexer_keys
        executor.bind(manager.bindings(), manager)
        pools = {p.object_kind: p for p in manager.layout.pools}
        self.latent_pool, self.key_pool = pools[ObjectKind.COMPRESSED_KV], pools[ObjectKind.INDEXER_STATE]
        assert manager.layout.main_layers == model.config.n_layers, "layout / model"

    def prefill(self, prompt: Tokens, *, chunk_tokens: int | None = None) -> V32Served:
        tokens = np.asarray(prompt, np.int64)
        m = self.manager
        rid = m.add_request(tokens)
        hit = m.match(rid)
        m.acquire(rid, hit)
        pieces = []
        while (done := m.request_tokens(rid)[0]) < len(tokens):
            count = len(tokens) - done if chunk_tokens is None else min(chunk_tokens, len(tokens) - done)
            alloc = m.allocate(rid, count)
            if alloc.plan is not None:
                m.complete(alloc.plan.plan_id, self.executor.run(alloc.plan))
            start = alloc.start_tokens
            logits, state = self.model.forward(tokens[start:start + count], self._load(alloc, start))
            self._write(self.latent_pool, alloc, [a[start:] for a in state.latents])
            self._write(self.key_pool, alloc, [a[start:] for a in state.keys])
            pieces.append(logits)
            m.commit(rid, count)
        m.release(rid)
        return V32Served(cached_tokens=hit.tokens, logits=np.concatenate(pieces), reasons=hit.codes)

    def _rows(self, pool: PoolSpec, alloc: Allocation, start: int) -> list[F32]:
        """Rows [0, start) of every layer of `pool`, read through its block table."""
        return [read_rows(self.executor, pool, alloc.block_tables[pool.name], 0, start, layer)
                for layer in range(pool.layer_count)]

    def _load(self, alloc: Allocation, start: int) -> V32State:
        state = V32State.empty(self.model.config)
        state.tokens = start
        if start:
            state.latents = self._rows(self.latent_pool, alloc, start)
            keys = self._rows(self.key_pool, alloc, start)
            state.keys = [np.zeros_like(k) for k in keys] if self.drop_indexer_keys else keys
        return state

    def _write(self, pool: PoolSpec, alloc: Allocation, rows: list[F32]) -> None:
        self.executor.write(pool.name, alloc.slots[pool.name], np.stack(rows, axis=1))  # (n, layers, width)
