"""The whole loop an engine runs against a CacheManager, with the reference executor and no model.

    python examples/manager_loop.py                      # tiny_v4
    python examples/manager_loop.py deepseek_v4_flash    # V4-Flash at block 16, small pools (about 200 MB)

Two requests share a system prompt; the second one resumes from the cache.  For
every request the engine (`serve` below):

1. `add_request(prompt)`: the manager hashes the prompt into block keys;
2. `match(rid)` -> `Hit`: the longest prefix P the cache can resume from
   (`hit.tokens`; `hit.reasons` say why it is not longer);
3. `acquire(rid, hit)`: pins what the hit reads; the request has now
   computed P tokens, so `request_tokens(rid)` is `(P, P, len(prompt))`;
4. `allocate(rid, n)` for the next n tokens (n <= known - allocated: after a
   hit, the prompt's last `len(prompt) - P` tokens, in chunks of any size);
5. the allocation's copy plan (copy-on-write of a partial page, seeding the
   working tail from the hit's snapshot) runs on the executor and goes back
   with `complete(plan_id, completion)`, before the model reads its state;
6. the model reads its state at `start_tokens` from the pools and writes
   what the n tokens produce (`write_allocation`: which rows go where);
7. `commit(rid, n)`: the manager publishes what is complete and keeps
   resume points;
8. decode: `append_tokens(rid, [token])`, then 4-7 with n = 1;
9. `release(rid)` (also on errors).

The "model" is a stand-in: every row is a function of the tokens up to its
position (`Rows`), so what the engine reads back from the pools at every
chunk's start can be compared with what a recomputation from scratch would
give.  It is, every time: for the second request the rows it reads at the hit
were written by the first.  A real engine writes its model's KV instead;
`hkv_exec_ref/engine/state_io.py` does that for the tiny DeepSeek-V4 model.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hkv_core.executor import Executor
from hkv_core.layout import EntryKind, Layout, PoolSpec
from hkv_core.manager import Allocation, CacheManager, ManagerConfig, check_invariants
from hkv_core.units import tail_start_token, window_start_token
from hkv_exec_ref import RefExecutor
from hkv_exec_ref.executor import NUMPY_DTYPES


def setup(preset: str) -> tuple[Layout, ManagerConfig]:
    """A layout and a config small enough for a laptop (sized per role: docs/executor.md)."""
    if preset == "tiny_v4":
        return Layout.from_preset("tiny_v4"), ManagerConfig(default_pool_pages=96, retain_every_blocks=2, key_seed=0)
    if preset == "deepseek_v4_flash":
        layout = Layout.from_preset("deepseek_v4_flash", block_tokens=16)
        tails = {p.name: 16 for p in layout.pools if p.entry_kind is EntryKind.TAIL_ROW}  # 10 MB a page (HCA)
        return layout, ManagerConfig(default_pool_pages=96, pool_pages=tails, retain_every_blocks=4, key_seed=0)
    raise SystemExit(f"unknown preset {preset!r}: tiny_v4 or deepseek_v4_flash")


# ------------------------------------------------------------------------------- the stand-in model


class Rows:
    """What the stand-in model computes: every pool's entry at a position is a function of tokens[:position + 1].

    Integers below 256 (exact in bf16) that differ by pool, layer, element and prefix.
    """

    def __init__(self, layout: Layout) -> None:
        self.pools = {spec.name: i for i, spec in enumerate(layout.pools)}

    @staticmethod
    def prefix_codes(tokens: NDArray[np.int64]) -> NDArray[np.int64]:
        """code[t]: a running hash of tokens[0..t] (so a row depends on its whole prefix, as KV does)."""
        codes, h = np.empty(len(tokens), np.int64), 0
        for t, token in enumerate(tokens.tolist()):
            h = (h * 33 + token + 1) % 256
            codes[t] = h
        return codes

    def values(self, spec: PoolSpec, codes: NDArray[np.int64], positions: NDArray[np.int64]) -> NDArray[Any]:
        """Entries of `spec` for `positions` (a row's position; a compressed entry's last token): shape
        (n, layers, *entry_shape), in the pool's dtype.  A negative position is the compressor tail's padding
        row (a = 0, z = -inf), which the tail of a ratio-4 layer holds before its first block completes."""
        n, width = len(positions), int(np.prod(spec.entry_shape))
        layer = np.arange(spec.layer_count)[None, :, None]
        element = np.arange(width)[None, None, :]
        code = np.where(positions >= 0, codes[np.maximum(positions, 0)], 0)[:, None, None]
        out = ((code + 7 * layer + 3 * element + self.pools[spec.name]) % 256).astype(np.float32)
        out = out.reshape(n, spec.layer_count, *spec.entry_shape)
        if spec.entry_kind is EntryKind.TAIL_ROW:
            pad = positions < 0
            out[pad, :, 0] = 0.0  # (a, z) rows: entry_shape (2, width)
            out[pad, :, 1] = -np.inf
        return encode(out, spec)


def encode(values: NDArray[np.float32], spec: PoolSpec) -> NDArray[Any]:
    """Values in the pool's dtype: a bf16 pool holds the raw bits as uint16 (the top half of the float32)."""
    if spec.dtype == "bf16":
        return (values.view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(NUMPY_DTYPES[spec.dtype])


# ------------------------------------------------------------------------------- where rows go


def tail_positions(p: int, spec: PoolSpec) -> NDArray[np.int64]:
    """The positions of a compressor tail's rows at P: [tail_start(P), P), row i at tail_start(P) + i."""
    return np.arange(tail_start_token(p, spec.compress_ratio), p, dtype=np.int64)


def write_tail(executor: Executor, spec: PoolSpec, page: int, p: int, rows: Rows,
               codes: NDArray[np.int64]) -> None:
    """The tail at P into rows 0, 1, ... of `page` (slot = page * entries_per_page + row)."""
    positions = tail_positions(p, spec)
    if positions.size:
        slots = page * spec.entries_per_page + np.arange(positions.size, dtype=np.int64)
        executor.write(spec.name, slots, rows.values(spec, codes, positions))


def write_allocation(executor: Executor, layout: Layout, alloc: Allocation, rows: Rows,
                     codes: NDArray[np.int64]) -> None:
    """Everything tokens [start, end) of an allocation produce, per pool:

    - window rows (`EntryKind.WINDOW_ROW`): one per token, position t into `slots[pool][t - start]`;
    - compressed entries and indexer keys (`COMPRESSED_ENTRY`, ratio r): one per entry the tokens complete,
      entries j in [start // r, end // r) into `slots[pool][j - start // r]` (entry j covers tokens
      [j r, (j + 1) r), written once its last token is computed);
    - compressor tails (`TAIL_ROW`): the tail at `end` into the working page `tail_pages[pool]`, rows 0..
      (positions [tail_start(end), end)), and for every retained boundary P' in `snapshots` (start < P' <= end)
      the tail at P' into `snapshots[P'][pool]`, the same way.  A real model computes in sub-chunks cut at those
      boundaries to have the tail at each P' (hkv_exec_ref's Engine does).
    """
    start, end = alloc.start_tokens, alloc.start_tokens + alloc.num_tokens
    for spec in layout.pools:
        if spec.entry_kind is EntryKind.WINDOW_ROW:
            positions = np.arange(start, end, dtype=np.int64)
        elif spec.entry_kind is EntryKind.COMPRESSED_ENTRY:
            r = spec.compress_ratio
            positions = np.arange(start // r, end // r, dtype=np.int64) * r + r - 1  # each entry's last token
        else:
            write_tail(executor, spec, alloc.tail_pages[spec.name], end, rows, codes)
            for boundary, pages in sorted(alloc.snapshots.items()):
                write_tail(executor, spec, pages[spec.name], boundary, rows, codes)
            continue
        slots = alloc.slots[spec.name]
        assert len(slots) == len(positions), (spec.name, len(slots), len(positions))
        if len(slots):
            executor.write(spec.name, slots, rows.values(spec, codes, positions))


def read_state(executor: Executor, layout: Layout, alloc: Allocation, p: int) -> dict[str, NDArray[Any]]:
    """The state a model resumes from at P = `alloc.start_tokens`, read from the pools through the allocation:
    window rows [window_start(P), P) and entries [0, P // r) through `block_tables[pool]`; the tail at P from
    `tail_pages[pool]` (seeded by the plan after a hit).  Shape (layers, n, *entry_shape) per pool."""
    state = {}
    for spec in layout.pools:
        if spec.entry_kind is EntryKind.TAIL_ROW:
            n = len(tail_positions(p, spec))
            slots = alloc.tail_pages[spec.name] * spec.entries_per_page + np.arange(n, dtype=np.int64)
        else:
            if spec.entry_kind is EntryKind.WINDOW_ROW:
                index = np.arange(window_start_token(p, layout.group(spec.group_name).window_tokens), p)
            else:
                index = np.arange(p // spec.compress_ratio)
            table = np.asarray(alloc.block_tables[spec.name], np.int64)
            slots = table[index // spec.entries_per_page] * spec.entries_per_page + index % spec.entries_per_page
        state[spec.name] = np.stack([np.asarray(executor.entries(spec.name, slots, layer))
                                     for layer in range(spec.layer_count)])
    return state


def expected_state(layout: Layout, p: int, rows: Rows, codes: NDArray[np.int64]) -> dict[str, NDArray[Any]]:
    """The same state recomputed from the tokens alone."""
    state = {}
    for spec in layout.pools:
        if spec.entry_kind is EntryKind.TAIL_ROW:
            positions = tail_positions(p, spec)
        elif spec.entry_kind is EntryKind.WINDOW_ROW:
            positions = np.arange(window_start_token(p, layout.group(spec.group_name).window_tokens), p)
        else:
            r = spec.compress_ratio
            positions = np.arange(p // r, dtype=np.int64) * r + r - 1
        state[spec.name] = rows.values(spec, codes, positions.astype(np.int64)).swapaxes(0, 1)
    return state


# ------------------------------------------------------------------------------- the loop


class StandIn:
    """The stand-in model's forward pass over an allocation: read the state at P from the pools (and check it
    against a recomputation), then write what the new tokens produce."""

    def __init__(self, layout: Layout, executor: Executor) -> None:
        self.layout, self.executor, self.rows = layout, executor, Rows(layout)
        self.states_checked = 0

    def forward(self, alloc: Allocation, tokens: list[int]) -> None:
        codes = Rows.prefix_codes(np.array(tokens, np.int64))
        p = alloc.start_tokens
        if p == 0:  # a fresh request's tail at P = 0 (ratio 4: padding rows) is the model's to write
            for spec in self.layout.pools:
                if spec.entry_kind is EntryKind.TAIL_ROW:
                    write_tail(self.executor, spec, alloc.tail_pages[spec.name], 0, self.rows, codes)
        found = read_state(self.executor, self.layout, alloc, p)
        want = expected_state(self.layout, p, self.rows, codes)
        for name in want:  # the state read at P is what recomputing from scratch gives
            assert np.array_equal(found[name], want[name]), f"{name}: the state read at P = {p} is not exact"
        self.states_checked += 1
        write_allocation(self.executor, self.layout, alloc, self.rows, codes)

    def next_token(self, tokens: list[int]) -> int:
        return int(Rows.prefix_codes(np.array(tokens, np.int64))[-1])


def serve(manager: CacheManager, executor: Executor, prompt: list[int], new_tokens: int, *,
          chunk_tokens: int = 64) -> dict[str, Any]:
    """One request through the cache: what it resumed from, and that every state it read was exact."""
    model = StandIn(manager.layout, executor)
    tokens = list(prompt)
    rid = manager.add_request(prompt)                # hashes the prompt into block keys
    try:
        hit = manager.match(rid)                     # Hit: tokens (= P), reasons, blocks, point, pages + versions
        manager.acquire(rid, hit)                    # pins it (StaleLease if anything moved since match)
        computed, allocated, known = manager.request_tokens(rid)  # (P, P, len(prompt)): allocate the rest
        assert computed == allocated == hit.tokens and known == len(prompt)
        while allocated < known:                     # prefill what the hit did not cover, in chunks
            n = min(chunk_tokens, known - allocated)
            alloc = manager.allocate(rid, n)         # pages and slots for tokens [allocated, allocated + n)
            if alloc.plan is not None:               # copy-on-write / tail seeding: run before reading the state
                manager.complete(alloc.plan.plan_id, executor.run(alloc.plan))
            model.forward(alloc, tokens)             # read the state at P, write slots, tail_pages, snapshots
            manager.commit(rid, n)                   # publish what completed, keep resume points
            allocated += n
        for _ in range(new_tokens):                  # decode: one verified token at a time
            tokens.append(model.next_token(tokens))
            manager.append_tokens(rid, tokens[-1:])
            alloc = manager.allocate(rid, 1)
            if alloc.plan is not None:
                manager.complete(alloc.plan.plan_id, executor.run(alloc.plan))
            model.forward(alloc, tokens)
            manager.commit(rid, 1)
    finally:
        manager.release(rid)                         # unpin, give back private pages, keep what the index uses
    assert check_invariants(manager) == []
    return {"prompt_tokens": len(prompt), "hit_tokens": hit.tokens, "reasons": hit.codes,
            "states_checked": model.states_checked, "tokens": tokens[len(prompt):]}


def main(preset: str = "tiny_v4") -> list[dict[str, Any]]:
    layout, config = setup(preset)
    manager = CacheManager(layout, config)
    executor = RefExecutor()
    executor.bind(manager.bindings(), manager)  # every pool allocated once, the manager verifies plans
    system = [(7 * i + 3) % 1000 for i in range(10 * layout.block_tokens + 3)]  # a shared system prompt
    first = serve(manager, executor, [*system, *range(1, 41)], 6)
    second = serve(manager, executor, [*system, *range(500, 550)], 6)  # resumes from the first one's prefix
    for name, result in (("first", first), ("second", second)):
        reasons = ", ".join(result["reasons"]) or "no reason codes"
        print(f"{preset} {name}: {result['prompt_tokens']} prompt tokens, {result['hit_tokens']} from the cache "
              f"({reasons}), {result['states_checked']} resume states read back exact")
    return [first, second]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("preset", nargs="?", default="tiny_v4", choices=("tiny_v4", "deepseek_v4_flash"))
    main(parser.parse_args().preset)
    sys.exit(0)
