"""A decode step's cache-facing work, written to be captured as a CUDA Graph over static block tables.

For the query at the resume point P of every TinyV4 layer, `DecodeReads.step()`
reads the cached state straight from the executor's pools through `StaticTable`s
(window rows P-W+1 .. P-1, compressed entries and indexer keys 0 .. P/r - 1),
appends the query's own latent row, picks the compressed set (the lightning
indexer's top-k on CSA layers, every visible entry on HCA) and attends with the
sink - the same functions TinyV4 runs (hkv_exec_ref.tiny_v4.attention / indexer).
The queries are static input buffers and the outputs static output buffers; index
arrays are built before capture, so the step makes no host round trip and its
kernel sequence is fixed (P is part of what was captured).

`reads_of_state(state, ...)` builds the same keys from a ModelState instead of the
pools: the reference the captured step is compared with (docs/cuda_executor.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from hkv_exec_cuda.executor import CudaExecutor
from hkv_exec_cuda.graph import CapturedStep, StaticTable
from hkv_exec_ref.engine.state_io import LayerRoute
from hkv_exec_ref.tiny_v4 import Config, TinyV4
from hkv_exec_ref.tiny_v4.attention import attend, visible_entries
from hkv_exec_ref.tiny_v4.indexer import select_entries
from hkv_exec_ref.tiny_v4.numerics import arrays_on, to_host
from hkv_exec_ref.tiny_v4.state import ModelState, window_start

__all__ = ["DecodeReads", "LayerQuery", "attention_from_state", "layer_attention", "random_queries"]


@attrs.define
class LayerQuery:
    """One layer's inputs at P: query (heads, D), own latent row (D,), indexer query and weights (CSA)."""

    q: Any
    kv: Any
    q_index: Any | None
    index_weights: Any | None


def random_queries(model: TinyV4, seed: int) -> list[LayerQuery]:
    """Host inputs for every layer (what a decode step's projections would produce)."""
    cfg, rng = model.config, np.random.default_rng(seed)

    def draw(*shape: int) -> Any:
        return rng.standard_normal(shape).astype(np.float32)

    out = []
    for ctx in model.layers:
        csa = ctx.weights.indexer is not None
        out.append(LayerQuery(q=draw(cfg.n_heads, cfg.head_dim), kv=draw(cfg.head_dim),
                              q_index=draw(cfg.index_heads, cfg.index_dim) if csa else None,
                              index_weights=draw(cfg.index_heads) if csa else None))
    return out


def layer_attention(model: TinyV4, layer: int, p: int, window: Any, entries: Any, index_keys: Any | None,
                    query: LayerQuery) -> Any:
    """Attention of the query at P over [window rows, own row] ++ compressed set: (heads, D)."""
    xp, ctx = model.xp, model.layers[layer]
    keys = xp.concatenate([window, query.kv[None, :]])
    ratio = ctx.spec.ratio
    if ratio:
        visible = visible_entries(p, ratio)
        if index_keys is not None and query.q_index is not None:
            chosen = select_entries(query.q_index, query.index_weights, index_keys[:visible], model.config.index_topk)
            keys = xp.concatenate([keys, entries[chosen]])
        else:
            keys = xp.concatenate([keys, entries[:visible]])
    return attend(query.q, keys, ctx.weights.sink)


def attention_from_state(model: TinyV4, state: ModelState, queries: list[LayerQuery]) -> list[Any]:
    """The reference: every layer's attention at P with keys taken from a ModelState (resume state at P)."""
    p = state.prefix_tokens
    return [layer_attention(model, i, p, layer.window, layer.entries, layer.index_keys, queries[i])
            for i, layer in enumerate(state.layers)]


@attrs.define
class _Gather:
    """Device constants that turn a static table into the slots of rows [first, stop) of one pool."""

    pool: str
    slot: int  # the layer's index in the pool's layer axis
    table: StaticTable
    page_at: Any  # (n,) index into the table
    offset: Any  # (n,) entry within the page


class DecodeReads:
    """Static tables, inputs and outputs of the decode attention step at P, and the step itself."""

    def __init__(self, executor: CudaExecutor, model: TinyV4, routes: tuple[LayerRoute, ...], p: int,
                 tables: dict[str, list[int]], queries: list[LayerQuery], *, spare_pages: int = 2) -> None:
        cfg: Config = model.config
        assert model.xp is executor.xp, "the model computes where the pools are"
        visible = [visible_entries(p, ctx.spec.ratio) if ctx.spec.ratio else 0 for ctx in model.layers]
        assert all(v == p // ctx.spec.ratio for v, ctx in zip(visible, model.layers, strict=True) if ctx.spec.ratio), \
            f"P={p}: the query's own block completes at P; choose P with (P + 1) % r != 0"
        self.executor, self.model, self.p, xp = executor, model, p, executor.xp
        self.tables = {pool: StaticTable(executor, pool, len(pages) + spare_pages, pages)
                       for pool, pages in tables.items()}
        with executor.stream:
            self.queries: list[LayerQuery] = [arrays_on(q, xp) for q in queries]
            self.outputs = [xp.zeros((cfg.n_heads, cfg.head_dim), np.float32) for _ in model.layers]
        w0 = window_start(p, cfg.window_tokens)
        self.reads = []
        for route, n in zip(routes, visible, strict=True):
            reads = {"window": self._gather(route, "window", w0, p)}
            for name in ("entries", "index_keys"):
                if name in route.pools:
                    reads[name] = self._gather(route, name, 0, n)
            self.reads.append(reads)

    def _gather(self, route: LayerRoute, field: str, first: int, stop: int) -> _Gather:
        spec = route.pools[field]
        index = np.arange(first, stop, dtype=np.int64)
        xp = self.executor.xp
        with self.executor.stream:
            page_at, offset = xp.asarray(index // spec.entries_per_page), xp.asarray(index % spec.entries_per_page)
        return _Gather(pool=spec.name, slot=route.slot, table=self.tables[spec.name], page_at=page_at,
                       offset=offset)

    def _rows(self, g: _Gather) -> Any:
        pool = self.executor.pools[g.pool]
        return pool[g.table.array[g.page_at], g.slot, g.offset].astype(np.float32)

    def step(self) -> None:
        """Every layer's attention at P from the pools, into the static outputs (no host round trip)."""
        empty = self.executor.xp.zeros((0, self.model.config.head_dim), np.float32)
        for i, reads in enumerate(self.reads):
            got = {name: self._rows(g) for name, g in reads.items()}
            out = layer_attention(self.model, i, self.p, got["window"], got.get("entries", empty),
                                  got.get("index_keys"), self.queries[i])
            self.outputs[i][...] = out

    def eager(self) -> list[Any]:
        """Run the step now, on the executor's stream; host copies of the outputs."""
        with self.executor.stream:
            self.step()
            self.executor.stream.synchronize()
        return self.host_outputs()

    def capture(self, name: str = "decode-attention") -> CapturedStep:
        """The step captured over the pools, the static tables, the inputs and the outputs."""
        buffers: dict[str, Callable[[], Any]] = {f"table {pool}": functools.partial(getattr, t, "array")
                                                 for pool, t in self.tables.items()}
        for i, q in enumerate(self.queries):
            buffers.update({f"layer {i} {f.name}": functools.partial(getattr, q, f.name)
                            for f in attrs.fields(LayerQuery) if getattr(q, f.name) is not None})
        buffers.update({f"layer {i} output": functools.partial(self.outputs.__getitem__, i)
                        for i in range(len(self.outputs))})
        return CapturedStep(self.executor, name, self.step, buffers)

    def host_outputs(self) -> list[Any]:
        """Host copies of the static outputs."""
        return [np.array(to_host(o)) for o in self.outputs]
