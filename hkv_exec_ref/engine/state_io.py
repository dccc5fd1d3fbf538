"""State routing: TinyV4's resume state read from and written to the executor's pools.

Each piece of a layer's state lives in the pool of its (group, object kind, entry
kind); nothing else holds it between forward passes.  Addresses come only from the
manager's Allocation:

- window rows of position t: `block_tables[window][t // block]`, row `t % block`;
- compressed entry / indexer key j: `block_tables[prefix][j // per_page]`, entry
  `j % per_page`;
- compressor tail (main and indexer) at P: the request's working tail page
  (`tail_pages[pool]`), row i = (a, z) of position `tail_start(P) + i`; rows at
  negative positions (r = 4 before block 0 completes) are written as the padding
  sentinel a = 0, z = -inf like any other row;
- new rows / entries of a step go to `slots[pool]` (window: one per token; prefix:
  one per entry completed in the allocation), tail rows at a retained boundary P'
  also to the snapshot pages `snapshots[P'][pool]`.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.executor import Executor
from hkv_core.layout import EntryKind, Layout, ObjectKind, PoolSpec
from hkv_core.manager import Allocation
from hkv_core.units import NULL_PAGE
from hkv_exec_ref.tiny_v4 import Config, LayerState, ModelState, TailRows
from hkv_exec_ref.tiny_v4.state import tail_start, window_start

# (object kind, entry kind) -> the LayerState field it holds: the whole routing table.
FIELD_OF: dict[tuple[ObjectKind, EntryKind], str] = {
    (ObjectKind.SWA_WINDOW, EntryKind.WINDOW_ROW): "window",
    (ObjectKind.COMPRESSED_KV, EntryKind.COMPRESSED_ENTRY): "entries",
    (ObjectKind.COMPRESSOR_TAIL, EntryKind.TAIL_ROW): "tail",
    (ObjectKind.INDEXER_STATE, EntryKind.COMPRESSED_ENTRY): "index_keys",
    (ObjectKind.INDEXER_STATE, EntryKind.TAIL_ROW): "index_tail",
}
TAIL_FIELDS = ("tail", "index_tail")
A_PART, Z_PART = 0, 1  # a tail entry is (a row, z row)


@attrs.frozen(kw_only=True)
class LayerRoute:
    """Where one model layer's state lives: its pools by field, and its index in their layer axis."""

    layer: int
    slot: int
    pools: dict[str, PoolSpec]


def routes(layout: Layout, cfg: Config) -> tuple[LayerRoute, ...]:
    """The route of every model layer; asserts the layout describes this model."""
    assert layout.main_layers == cfg.n_layers and layout.window_tokens == cfg.window_tokens, "layout/model"
    out: dict[int, LayerRoute] = {}
    for group in layout.groups:
        pools = {FIELD_OF[(p.object_kind, p.entry_kind)]: p for p in layout.pools if p.group_name == group.name}
        for slot, layer in enumerate(group.layer_ids):
            assert cfg.compress_ratios[layer] == group.compress_ratio, (layer, group)
            out[layer] = LayerRoute(layer=layer, slot=slot, pools=pools)
    assert sorted(out) == list(range(cfg.n_layers)), "every layer has a group"
    return tuple(out[i] for i in range(cfg.n_layers))


def read_rows(executor: Executor, spec: PoolSpec, table: NDArray[np.int32], first: int, stop: int,
               slot: int) -> NDArray[np.float32]:
    """Rows / entries [first, stop) of a block-table pool (window or prefix), in the executor's array module."""
    index = np.arange(first, stop, dtype=np.int64)
    per_page = spec.entries_per_page
    pages = table.astype(np.int64)[index // per_page]
    assert not np.any(pages == NULL_PAGE), f"{spec.name}: state read from the NULL page"
    rows: NDArray[np.float32] = executor.entries(spec.name, pages * per_page + index % per_page, slot)
    return rows.astype(np.float32, copy=False)


def _read_tail(executor: Executor, spec: PoolSpec, page: int, p: int, route: LayerRoute,
               cfg: Config) -> TailRows:
    layer_spec = cfg.layer_spec(route.layer)
    start = tail_start(p, layer_spec.ratio, layer_spec.overlap)
    rows = p - start
    assert rows <= spec.entries_per_page, f"{spec.name}: {rows} tail rows do not fit a page"
    assert page != NULL_PAGE, f"{spec.name}: tail read from the NULL page"
    slots = page * spec.entries_per_page + np.arange(rows, dtype=np.int64)
    data = executor.entries(spec.name, slots, route.slot).astype(np.float32, copy=False)
    return TailRows(start=start, a=data[:, A_PART].copy(), z=data[:, Z_PART].copy())


def read_layer(executor: Executor, route: LayerRoute, alloc: Allocation, p: int, cfg: Config) -> LayerState:
    """One layer's minimal resume state at P, every row read from the pools."""
    layer_spec = cfg.layer_spec(route.layer)
    fields: dict[str, Any] = {"index_keys": None, "tail": None, "index_tail": None}
    window = route.pools["window"]
    w0 = window_start(p, cfg.window_tokens)
    rows = read_rows(executor, window, alloc.block_tables[window.name], w0, p, route.slot) if p > w0 else None
    fields["window"] = rows if rows is not None else executor.xp.zeros((0, cfg.head_dim), np.float32)
    fields["entries"] = executor.xp.zeros((0, cfg.head_dim), np.float32)
    for name in ("entries", "index_keys"):
        if name in route.pools:
            spec = route.pools[name]
            fields[name] = read_rows(executor, spec, alloc.block_tables[spec.name], 0, p // layer_spec.ratio,
                                      route.slot)
    for name in TAIL_FIELDS:
        if name in route.pools:
            spec = route.pools[name]
            fields[name] = _read_tail(executor, spec, alloc.tail_pages[spec.name], p, route, cfg)
    return LayerState(spec=layer_spec, window_start=w0, **fields)


def read_state(executor: Executor, layer_routes: tuple[LayerRoute, ...], alloc: Allocation, p: int,
               cfg: Config) -> ModelState:
    """The model's resume state at P, read from the pools through the allocation's tables."""
    assert alloc.start_tokens <= p <= alloc.start_tokens + alloc.num_tokens, (p, alloc.start_tokens)
    layers = tuple(read_layer(executor, route, alloc, p, cfg) for route in layer_routes)
    return ModelState(prefix_tokens=p, layers=layers)


class Writes:
    """Entries to write, collected per pool and slot so that each pool gets one write call."""

    def __init__(self, layer_routes: tuple[LayerRoute, ...]) -> None:
        self.layers = {route.pools[f].name: route.pools[f].layer_count for route in layer_routes
                       for f in route.pools}
        self.pending: dict[str, dict[int, tuple[NDArray[np.int64], NDArray[Any]]]] = {}

    def add(self, pool: str, slot: int, slots: NDArray[np.int64], values: NDArray[Any]) -> None:
        assert slots.shape[0] == values.shape[0], (pool, slots.shape, values.shape)
        self.pending.setdefault(pool, {})[slot] = (slots, values)

    def flush(self, executor: Executor) -> None:
        for pool, by_slot in self.pending.items():
            assert sorted(by_slot) == list(range(self.layers[pool])), f"{pool}: every layer written"
            slots = by_slot[0][0]
            assert all(np.array_equal(s, slots) for s, _ in by_slot.values()), "layers share slots"
            if slots.size:
                values = np.stack([by_slot[k][1] for k in range(len(by_slot))], axis=1)
                executor.write(pool, slots, values)
        self.pending.clear()


def _tail_values(rows: TailRows) -> NDArray[np.float32]:
    return np.stack([rows.a, rows.z], axis=1)


def write_tails(writes: Writes, route: LayerRoute, layer: LayerState, pages: dict[str, int]) -> None:
    """Every tail row of `layer` into rows 0.. of `pages[pool]` (working or snapshot page)."""
    for name in TAIL_FIELDS:
        rows = getattr(layer, name)
        if name in route.pools and rows is not None and route.pools[name].name in pages:
            spec = route.pools[name]
            n = rows.a.shape[0]
            assert n <= spec.entries_per_page and pages[spec.name] != NULL_PAGE, (spec.name, n)
            slots = pages[spec.name] * spec.entries_per_page + np.arange(n, dtype=np.int64)
            writes.add(spec.name, route.slot, slots, _tail_values(rows))


def write_step(writes: Writes, route: LayerRoute, alloc: Allocation, before: int, layer: LayerState,
               cfg: Config) -> None:
    """What a step from P = `before` to `layer`'s P' added: window rows, completed entries, the tail."""
    write_rows(writes, route, alloc, before, layer, cfg)
    write_tails(writes, route, layer, alloc.tail_pages)


def write_rows(writes: Writes, route: LayerRoute, alloc: Allocation, before: int, layer: LayerState,
               cfg: Config) -> None:
    """The window rows and completed entries of a step from P = `before` to `layer`'s P'."""
    after = layer.window_start + layer.window.shape[0]
    assert layer.window_start <= before, "the step's window rows are all in the state (sub-chunk <= W - 1)"
    window = route.pools["window"]
    lo = before - alloc.start_tokens
    writes.add(window.name, route.slot, alloc.slots[window.name][lo:lo + after - before],
               layer.window[before - layer.window_start:])
    ratio = cfg.layer_spec(route.layer).ratio
    for name in ("entries", "index_keys"):
        if name in route.pools:
            spec, values = route.pools[name], getattr(layer, name)
            first = alloc.start_tokens // ratio
            new = slice(before // ratio, after // ratio)
            writes.add(spec.name, route.slot, alloc.slots[spec.name][new.start - first:new.stop - first],
                       values[new])


def write_state(executor: Executor, layer_routes: tuple[LayerRoute, ...], alloc: Allocation, before: int,
                state: ModelState, cfg: Config) -> None:
    """Write a step's results, and the tail at a retained boundary into its snapshot pages."""
    writes = Writes(layer_routes)
    for route, layer in zip(layer_routes, state.layers, strict=True):
        write_step(writes, route, alloc, before, layer, cfg)
    writes.flush(executor)
    snapshot = alloc.snapshots.get(state.prefix_tokens)
    if snapshot is not None:
        for route, layer in zip(layer_routes, state.layers, strict=True):
            write_tails(writes, route, layer, snapshot)
        writes.flush(executor)


def write_initial_tails(executor: Executor, layer_routes: tuple[LayerRoute, ...], alloc: Allocation,
                        empty: ModelState) -> None:
    """At P = 0 the working tail pages get the empty state's rows (r = 4: the padding sentinel)."""
    assert empty.prefix_tokens == 0 and alloc.start_tokens == 0
    writes = Writes(layer_routes)
    for route, layer in zip(layer_routes, empty.layers, strict=True):
        write_tails(writes, route, layer, alloc.tail_pages)
    writes.flush(executor)




def write_draft(executor: Executor, layer_routes: tuple[LayerRoute, ...], alloc: Allocation, extended: ModelState,
                cfg: Config) -> None:
    """Write a speculative step's results (`extended`: the verification pass's state, every row kept): window
    rows and entries in place, the tail at every end E it may be accepted at into `alloc.draft_tails[E]`,
    the tail at each retained boundary into its snapshot pages.  Nothing depends on what is accepted, and
    the working tail (the checkpoint) is not written."""
    writes = Writes(layer_routes)
    for route, layer in zip(layer_routes, extended.layers, strict=True):
        write_rows(writes, route, alloc, alloc.start_tokens, layer, cfg)
    writes.flush(executor)
    last: dict[tuple[str, int], int] = {}  # (pool, page) -> the largest E whose tail it holds: rows
    for e, pages in sorted(alloc.draft_tails.items()):  # [tail_start(E), E) hold every smaller E's tail too
        for pool, page in pages.items():
            last[(pool, page)] = e
    due: dict[int, dict[str, int]] = {}
    for (pool, page), e in last.items():
        due.setdefault(e, {})[pool] = page
    for e, pages in [*sorted(due.items()), *sorted(alloc.snapshots.items())]:
        state = extended.resume_at(e, cfg)
        for route, layer in zip(layer_routes, state.layers, strict=True):
            write_tails(writes, route, layer, pages)
        writes.flush(executor)
