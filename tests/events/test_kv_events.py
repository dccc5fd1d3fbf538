"""KV cache events: a router that replays `take_events()` knows exactly what the index holds.

Random histories (shared and diverging prompts served in one or two chunks,
forced evictions, evictions for allocations in small pools, `clear_cache`)
on a V4 layout, a sliding + full layout and a full-attention layout.  After
every step the replayed view must equal the index: the same block hashes,
the same resume points at the right token positions; every BlockStored
carries the tokens its hashes were made from (re-hashed here with the
shared seed), every parent is known before its child, a block leaves only
after its resume point.  Broken logs (a dropped kind of record) are caught.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hkv_core.block_keys import keys_bytes as hashes
from hkv_core.errors import CacheBusy, ConfigError
from hkv_core.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventsLost,
    KVEvent,
    ResumePointRemoved,
    ResumePointStored,
)
from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig, OutOfPages
from hkv_core.manager.index import NO_POINT, EventLog
from hkv_core.plan import Completion

PRESETS = ("tiny_v4", "swa_full", "llama_full")
SEED = 7


class Router:
    """What a cache-aware router keeps per instance, built from events only."""

    def __init__(self) -> None:
        self.blocks: dict[bytes, bytes | None] = {}  # hash -> parent hash
        self.points: dict[bytes, int] = {}  # block hash -> position (tokens)
        self.errors: list[str] = []

    def apply(self, events: list[KVEvent]) -> None:
        for event in events:
            self._apply(event)

    def _apply(self, event: KVEvent) -> None:
        if isinstance(event, BlockStored):
            parent = event.parent_block_hash
            if parent is not None and parent not in self.blocks:
                self.errors.append("a stored block's parent is unknown")
            for h in event.block_hashes:
                self.blocks[h] = parent
                parent = h
        elif isinstance(event, BlockRemoved):
            for h in event.block_hashes:
                if h in self.points:
                    self.errors.append("a block left before its resume point")
                if self.blocks.pop(h, b"missing") == b"missing":
                    self.errors.append("removed a block never stored")
        elif isinstance(event, ResumePointStored):
            if event.block_hash not in self.blocks:
                self.errors.append("a resume point on an unknown block")
            self.points[event.block_hash] = event.position_tokens
        elif isinstance(event, ResumePointRemoved):
            for h in event.block_hashes:
                if self.points.pop(h, -1) < 0:
                    self.errors.append("removed a resume point never stored")
        elif isinstance(event, AllBlocksCleared):
            self.blocks.clear()
            self.points.clear()
        else:
            assert isinstance(event, EventsLost)
            self.errors.append(f"{event.count} batches lost")


def index_truth(m: CacheManager) -> tuple[set[bytes], set[bytes]]:
    """(block hashes, hashes of blocks with a resume point) the index holds, read from its tables."""
    blocks = m.core.index.blocks
    live = np.flatnonzero(blocks.state != blocks.s_free)
    with_point = live[blocks.point[live] != NO_POINT]
    return set(hashes(blocks.key[live])), set(hashes(blocks.key[with_point]))


def mismatches(m: CacheManager, router: Router, positions: dict[bytes, int]) -> list[str]:
    """Everything the router got wrong about `m` (empty: its view is exact)."""
    blocks, points = index_truth(m)
    out = list(router.errors)
    if set(router.blocks) != blocks:
        out.append(f"blocks differ: {len(set(router.blocks) - blocks)} extra, {len(blocks - set(router.blocks))} "
                   "missing")
    if set(router.points) != points:
        out.append(f"points differ: {len(set(router.points) - points)} extra, {len(points - set(router.points))} "
                   "missing")
    out += [f"point at {p} is not at the end of its block" for h, p in router.points.items()
            if positions.get(h) != p]
    return out


def check_tokens(m: CacheManager, events: list[KVEvent]) -> None:
    """Each BlockStored's hashes are the keys of its tokens under its parent (same seed)."""
    hasher = m.core.hasher
    for event in events:
        if isinstance(event, BlockStored):
            tokens = np.array(event.token_ids, np.int64)
            assert len(tokens) == len(event.block_hashes) * event.block_size
            parent = event.parent_block_hash
            keys = hasher.hash_blocks(tokens, parent=parent, start_block=0 if parent is None else 1)
            assert hashes(keys) == event.block_hashes


def manager(preset: str, pages: int) -> CacheManager:
    return CacheManager(Layout.from_preset(preset, block_tokens=8),
                        ManagerConfig(key_seed=SEED, kv_events=True, default_pool_pages=pages, retain_every_blocks=2))


def serve(m: CacheManager, tokens: np.ndarray, chunks: int) -> bool:
    """Match, acquire, allocate and commit the rest in `chunks`, release; False when the pools are too small."""
    rid = m.add_request(tokens)
    hit = m.match(rid)
    m.acquire(rid, hit)
    todo = len(tokens) - hit.tokens
    try:
        for part in np.array_split(np.arange(todo), chunks):
            if not part.size:
                continue
            alloc = m.allocate(rid, part.size)
            if alloc.plan is not None:
                m.complete(alloc.plan.plan_id, Completion())
            m.commit(rid, part.size)
    except OutOfPages:
        m.release(rid)
        return False
    m.release(rid)
    return True


def prompt_positions(m: CacheManager, tokens: np.ndarray) -> Iterator[tuple[bytes, int]]:
    bt = m.layout.block_tokens
    for i, h in enumerate(hashes(m.core.hasher.hash_blocks(tokens))):
        yield h, (i + 1) * bt


OPS = st.lists(st.tuples(st.sampled_from(["serve", "serve", "serve", "evict", "clear"]),
                         st.integers(0, 3), st.integers(1, 200), st.integers(1, 2)), min_size=1, max_size=12)


def run_history(preset: str, ops: list[tuple[str, int, int, int]], log_class: type[EventLog] = EventLog) -> list[str]:
    """Play `ops` with events replayed into a router after every step; the first mismatch list found."""
    m = manager(preset, pages=48)
    m.core.index.log = log_class(m.config.max_pending_events, m.layout.block_tokens)
    base = np.random.default_rng(0).integers(0, 50_000, size=(4, 240))
    router, positions = Router(), {}
    for op, which, length, chunks in ops:
        if op == "serve":
            tokens = base[which][:length].copy()
            positions.update(prompt_positions(m, tokens))
            serve(m, tokens, chunks)
        elif op == "evict":
            m.evict(length // 20 + 1)
        else:
            m.clear_cache()
        events = m.take_events()
        check_tokens(m, events)
        router.apply(events)
        found = mismatches(m, router, positions)
        if found:
            return found
    return []


@pytest.mark.parametrize("preset", PRESETS)
@given(ops=OPS)
@settings(max_examples=60)
def test_router_replay_equals_the_index(preset: str, ops: list[tuple[str, int, int, int]]) -> None:
    assert run_history(preset, ops) == []


class ForgetsPointRemovals(EventLog):
    def points_removed(self, keys: np.ndarray) -> None:
        return None


class ForgetsBlockRemovals(EventLog):
    def removed(self, keys: np.ndarray) -> None:
        return None


class ForgetsClears(EventLog):
    def cleared(self) -> None:  # the clear's removals were not recorded, and it does not say AllBlocksCleared
        return None


SHARED_THEN_EVICT = [("serve", 0, 200, 1), ("serve", 0, 120, 2), ("serve", 1, 200, 1), ("evict", 0, 200, 1)]


@pytest.mark.parametrize(("broken", "ops"), [
    (ForgetsPointRemovals, SHARED_THEN_EVICT),
    (ForgetsBlockRemovals, SHARED_THEN_EVICT),
    (ForgetsClears, [("serve", 0, 200, 1), ("clear", 0, 1, 1)]),
])
def test_a_broken_log_is_caught(broken: type[EventLog], ops: list[tuple[str, int, int, int]]) -> None:
    assert run_history("tiny_v4", ops, EventLog) == []
    assert run_history("tiny_v4", ops, broken) != []


def test_events_are_off_by_default_and_cost_nothing() -> None:
    m = CacheManager(Layout.from_preset("tiny_v4"), ManagerConfig(key_seed=SEED))
    assert m.core.index.log is None
    with pytest.raises(ConfigError) as err:
        m.take_events()
    assert err.value.key == "kv_events"


def test_a_full_log_drops_the_oldest_and_says_how_many() -> None:
    m = CacheManager(Layout.from_preset("tiny_v4", block_tokens=8),
                     ManagerConfig(key_seed=SEED, kv_events=True, max_pending_events=1))
    serve(m, np.arange(100), 2)  # two chunks: two BlockStored records and resume points, more than 1
    events = m.take_events()
    assert isinstance(events[0], EventsLost) and events[0].count > 0
    assert len(events) >= 2 and not any(isinstance(e, EventsLost) for e in events[1:])  # the newest kept
    assert m.take_events() == []


@pytest.mark.parametrize("capacity", [1, 2, 3, 5])
def test_clear_cache_is_one_event_even_when_the_log_is_nearly_full(capacity: int) -> None:
    m = CacheManager(Layout.from_preset("tiny_v4", block_tokens=8),
                     ManagerConfig(key_seed=SEED, kv_events=True, max_pending_events=capacity))
    serve(m, np.arange(60), 1)  # one BlockStored record and one of resume points
    kept = m.take_events()
    serve(m, np.arange(60, 100), 1)
    log = m.core.index.log
    assert log is not None
    pending, lost_before = len(log.records), log.lost
    m.clear_cache()
    events = m.take_events()
    assert events[-1] == AllBlocksCleared() and sum(isinstance(e, AllBlocksCleared) for e in events) == 1
    assert not any(isinstance(e, (BlockRemoved, ResumePointRemoved)) for e in events)
    lost = lost_before + max(0, pending + 1 - capacity)  # the clear costs one record, whatever it evicted
    assert (events[0] == EventsLost(count=lost)) if lost > 0 else not isinstance(events[0], EventsLost)
    assert kept


def test_clear_cache_is_one_event_and_refused_while_requests_run() -> None:
    m = manager("tiny_v4", pages=64)
    serve(m, np.arange(120), 1)
    rid = m.add_request(np.arange(50))
    before = m.snapshot()
    with pytest.raises(CacheBusy) as err:
        m.clear_cache()
    assert err.value.live_requests == 1 and m.snapshot() == before
    m.release(rid)
    m.take_events()
    assert m.clear_cache() > 0
    assert m.take_events() == [AllBlocksCleared()]
    assert m.index_counts()["blocks"] == 0


def test_lora_ids_and_names_travel_in_block_stored() -> None:
    m = manager("llama_full", pages=64)
    for lora in (3, "adapter-a"):
        rid = m.add_request(np.arange(40), lora_id=lora)
        m.acquire(rid, m.match(rid))
        m.allocate(rid, 40)
        m.commit(rid, 40)
        m.release(rid)
    stored = [e for e in m.take_events() if isinstance(e, BlockStored)]
    assert [(e.lora_id, e.lora_name) for e in stored] == [(3, None), (None, "adapter-a")]
    assert stored[0].block_hashes != stored[1].block_hashes  # the adapter is part of the key
