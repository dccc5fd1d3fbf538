"""HkvKVCacheManager: hkv's CacheManager behind vLLM's KVCacheManager interface (docs/vllm.md).

The constructor takes vLLM's own arguments, so `hkv_vllm.Scheduler` (or a
test that swaps the class) builds it where vLLM builds its manager.  Each
vLLM request is an hkv request, registered (its tokens hashed with hkv's
block keys: cache salt, LoRA adapter and multimodal items in the key) when
the scheduler first asks for its cached blocks; vLLM block ids are hkv pages
(`layout.py`).  What differs from vLLM's manager, and why it is safe:

- Visibility: vLLM marks a block cached when it is *scheduled*; hkv commits
  a block only once vLLM reports its tokens *computed*
  (`request.num_computed_tokens`, read at the request's next allocation and
  at `free`).  A block scheduled but not yet computed is never a hit for
  another request, so a hit never reads KV that is still being written;
  a waiting request that shares prompt blocks being computed waits a step
  for them instead (`in_flight.py`, `wait_for_shared_prefills`).
- EAGLE (`use_eagle`): the hit is the longest at most one block shorter than
  hkv's longest (`match(max_tokens=...)`), so the drafter recomputes the
  last block, as vLLM drops the last matched block.
- Every hit is one length for all groups, the longest resume point whose
  every object is present (hkv's validation: for a sliding-window group, the
  blocks of the window before it), never longer.
- Fine hits (`fine_hits`, from vLLM's `additional_config`): hkv keys
  16-token blocks and resumes at any of them, inside vLLM's blocks; the
  hit's partial last block is copied on write by vLLM's worker
  (`take_kv_cache_block_copies`, `copies.py`), so no request writes into a
  block another reads.
- Groups: every KV cache group is an hkv pool drawing its pages from one
  block space, as vLLM's groups draw from its one block pool (`layout.py`);
  a sliding-window group's blocks become the null block as hkv drops them
  from the window (at commit), where vLLM drops them in
  `remove_skipped_blocks`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from hkv_core.block_keys import TOKEN_ID_LIMIT
from hkv_core.errors import InvalidArgument, InvalidRequestState, InvalidTokens, OutOfPages, StaleLease
from hkv_core.manager import CacheManager, Hit, ManagerConfig
from hkv_vllm.checkpoints import Checkpoints
from hkv_vllm.copies import FINE_HIT_TOKENS, BlockCopies
from hkv_vllm.errors import UnsupportedVllmConfig
from hkv_vllm.events import vllm_events
from hkv_vllm.in_flight import PrefillsInFlight
from hkv_vllm.keys import request_keys
from hkv_vllm.layout import VllmLayout, layout_from_kv_cache_config
from hkv_vllm.requests import Blocks, Entry
from hkv_vllm.views import BlockPoolView, CoordinatorView

logger = logging.getLogger("hkv_vllm")


class HkvKVCacheManager:
    """vLLM's KVCacheManager, with hkv deciding hits, pages, publication and eviction."""

    def __init__(self, kv_cache_config: Any, max_model_len: int, scheduler_block_size: int, hash_block_size: int,
                 max_in_flight_tokens: int | None = None, enable_caching: bool = True, use_eagle: bool = False,
                 num_prefill_lookahead: int = 0, log_stats: bool = False, enable_kv_cache_events: bool = False,
                 dcp_world_size: int = 1, pcp_world_size: int = 1, metrics_collector: Any = None,
                 watermark: float = 0.0, enable_mamba_shared_prefix_checkpoint: bool = False,
                 fine_hits: bool = False, wait_for_shared_prefills: bool = True) -> None:
        from vllm.v1.core.kv_cache_coordinator import _validate_prefix_cache_retention_interval
        from vllm.v1.core.kv_cache_manager import KVCacheBlocks
        from vllm.v1.kv_cache_interface import AttentionSpec, CircularBufferSpec
        from vllm.v1.metrics.stats import PrefixCacheStats

        _refuse(dcp=dcp_world_size, pcp=pcp_world_size)
        # checked as vLLM checks it (ValueError); hkv then keeps a resume point at every block, denser than any
        # retention interval asks, so its hits are never shorter than vLLM's for it
        _validate_prefix_cache_retention_interval(kv_cache_config.prefix_cache_retention_interval,
                                                  scheduler_block_size, kv_cache_config)
        # fine hits: hkv keys blocks finer than vLLM hashes them and resumes at any of them, copying a hit's
        # partial last block on vLLM's worker (`copies.py`); else hkv's block is vLLM's hash block
        block = math.gcd(hash_block_size, FINE_HIT_TOKENS) if fine_hits else hash_block_size
        self.vllm_layout: VllmLayout = layout_from_kv_cache_config(kv_cache_config, hash_block_size=block,
                                                                   fine_hits=fine_hits)
        self.fine_hits = fine_hits
        # vLLM's sub-block hits: a Mamba block of several hash blocks, hits on any hash block (vLLM's own rule, so
        # its scheduler splits chunks where hkv keeps the states: `coordinator.enable_partial_hash_hits`)
        self.sub_block_hits = enable_caching and not fine_hits and _partial_hash_hits(kv_cache_config, hash_block_size)
        self.kv_cache_config, self.max_model_len = kv_cache_config, max_model_len
        self.enable_caching, self.enable_kv_cache_events = enable_caching, enable_kv_cache_events
        self.use_eagle, self.log_stats, self.metrics_collector = use_eagle, log_stats, metrics_collector
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        # one block space for every group, as vLLM's block pool: each takes blocks when it needs them
        self.hkv = CacheManager(self.vllm_layout.layout, ManagerConfig(
            shared_pages=self.vllm_layout.shared_pages, max_requests=1 << 16,
            max_request_tokens=max(max_model_len, 1) + 1, retain_every_blocks=1,
            allow_partial_page_copy=fine_hits or self.sub_block_hits, kv_events=enable_kv_cache_events,
            # sub-block hits: an allocation reserves a resume-point row at every hash block it covers (a step keeps
            # one where it ends), more rows than the state pages that bound them otherwise
            max_points=self.vllm_layout.shared_pages * max(g.block_size for g in self.vllm_layout.groups) // block
            if self.sub_block_hits else None))
        self.groups = self.vllm_layout.groups
        self.windowed = tuple(g for g in self.groups if g.sliding)  # blocks hkv releases while the request runs
        self.stateful = any(g.state for g in self.groups)  # Mamba groups: a commit must end where a step ended
        self.state_groups = tuple(g for g in self.groups if g.state)
        self.state_offers: dict[str, list[tuple[int, int, int]]] = {}  # a connector's state hand-offs, not drained
        self.checkpoints = Checkpoints(self.state_groups, block, block if self.sub_block_hits else scheduler_block_size,
                                       kv_cache_config.prefix_cache_retention_interval)
        self.state_block = self.state_groups[0].block_size if self.state_groups else 0  # (all alike: layout.py)
        if self.stateful and (use_eagle or num_prefill_lookahead):
            raise UnsupportedVllmConfig(feature="mamba_speculative_blocks", detail="EAGLE or prefill lookahead with "
                                        "a Mamba group (hkv serves its state columns without speculative blocks)")
        self.blocks = Blocks(kv_cache_config.num_blocks)
        self.copies = BlockCopies(self.hkv, self.blocks, self.groups)
        self.wait_for_shared_prefills = wait_for_shared_prefills and enable_caching
        self.prefills_in_flight = PrefillsInFlight(
            hash_block_size, self.vllm_layout.block_tokens if fine_hits else scheduler_block_size)
        self.entries: dict[str, Entry] = {}
        self.unfit_hits: set[str] = set()  # requests whose hit never fits (`_unfit_hit`): they take none
        self.deferred: dict[tuple[int, ...], Entry] = {}  # requests freed by vLLM, their blocks not yet returned
        self.block_pool = BlockPoolView(self)
        specs = [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups]
        # as vLLM's managers: attention groups of a cache that needs zeroing record new blocks (a ring is read
        # only where its own request wrote it)
        self.zeroing = [bool(kv_cache_config.needs_kv_cache_zeroing) and isinstance(spec, AttentionSpec)
                        and not isinstance(spec, CircularBufferSpec) for spec in specs]
        self.new_block_ids: list[int] = []
        self.coordinator = CoordinatorView(self, specs)
        self.num_kv_cache_groups = len(specs)
        self.retained_hit_group_ids: tuple[int, ...] = ()
        self.mamba_shared_prefix_checkpoint = False
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in specs))
        self._KVCacheBlocks, self._PrefixCacheStats = KVCacheBlocks, PrefixCacheStats
        self._block_tokens = self.vllm_layout.block_tokens  # hkv's block: vLLM's hash block
        eagle = [g.block_size for g, spec in zip(self.groups, kv_cache_config.kv_cache_groups, strict=True)
                 if spec.is_eagle_group] or [g.block_size for g in self.groups]
        self._eagle_drop_tokens = max(eagle)  # what EAGLE recomputes past a hit: the eagle groups' last block
        in_flight = max_model_len if max_in_flight_tokens is None else max_in_flight_tokens
        self._no_caps = [1 << 62] * len(specs)
        self._admission_caps = [spec.max_admission_blocks_per_request(in_flight, max_model_len) if g.window
                                and hasattr(spec, "max_admission_blocks_per_request") else 1 << 62
                                for g, spec in zip(self.groups, specs, strict=True)]  # as vLLM caps admission

    # ------------------------------------------------------------------ counts and stats

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def make_prefix_cache_stats(self) -> Any:
        if not self.log_stats:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, self._PrefixCacheStats()
        return stats

    def prefix_cache_lookup_enabled(self, request: Any) -> bool:
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request: Any, num_hits: int) -> None:
        if self.log_stats and self.prefix_cache_lookup_enabled(request):
            assert self.prefix_cache_stats is not None
            self.prefix_cache_stats.record(num_tokens=request.num_tokens, num_hits=num_hits,
                                           preempted=request.num_preemptions > 0)

    # ------------------------------------------------------------------ hits

    def get_computed_blocks(self, request: Any) -> tuple[Any, int, int]:
        """The hit hkv validated for the request: its blocks, its tokens, and where its cached prefix ends when
        that is further (a Mamba model: vLLM's scheduler ends a step there, and hkv keeps the state where a step
        ended: the junction siblings resume at), else 0."""
        if not request.num_tokens:  # an empty prompt (vLLM's front ends refuse it): no hit, nothing registered
            return self.empty_kv_cache_blocks, 0, 0
        entry = self._entry(request)
        if entry.acquired or request.request_id in self.unfit_hits or not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        entry.hit = self.hkv.match(entry.rid)
        if self.use_eagle and entry.hit.tokens:  # EAGLE recomputes the hit's last block for its hidden states
            entry.hit = self.hkv.match(entry.rid, max_tokens=self._eagle_limit(entry.hit))
        junction = entry.hit.candidate_tokens if self.stateful and entry.hit.candidate_tokens > entry.hit.tokens else 0
        if not entry.hit.tokens:
            return self.empty_kv_cache_blocks, 0, junction
        blocks = tuple([self.blocks.by_id[i] for i in ids] for ids in self._hit_ids(entry.hit))
        return self.create_kv_cache_blocks(blocks), entry.hit.tokens, junction

    def waits_for_prefill_in_flight(self, request: Any) -> bool:
        """Whether a waiting request resumes further by waiting a step: a prompt block of its, past the hit it
        would take now, is being computed by a request in flight (`in_flight.py`); hkv's scheduler then skips
        it for this step."""
        if (not self.wait_for_shared_prefills or request.num_computed_tokens or not request.num_tokens
                or not self.prefix_cache_lookup_enabled(request)):
            return False
        return self.prefills_in_flight.queue_waits(request.block_hashes, request.num_tokens,
                                                   lambda: int(self.get_computed_blocks(request)[1]))

    def _eagle_limit(self, hit: Hit) -> int:
        """The longest hit EAGLE may take: one eagle-group block shorter than hkv's hit (one block size), or
        than the cached prefix (block sizes that differ: the hit lands on their LCM, and the block after it
        must be cached, as vLLM asks)."""
        if self.fine_hits:  # fine lookups drop one hkv block, as vLLM's fine-grained ones drop one hash block
            return hit.tokens - self._block_tokens
        if self.vllm_layout.uniform:
            return hit.tokens - self._eagle_drop_tokens
        return max(0, min(hit.tokens, hit.candidate_tokens - self._eagle_drop_tokens))

    def get_computed_blocks_for_connector(self, request: Any) -> tuple[Any, int, int, bool]:
        return *self.get_computed_blocks(request), False

    # ------------------------------------------------------------------ allocation

    def allocate_slots(self, request: Any, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: Any = None, num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0, delay_cache_blocks: bool = False,
                       num_encoder_tokens: int = 0, full_sequence_must_fit: bool = False, reserved_blocks: int = 0,
                       has_scheduled_reqs: bool = True, skip_zeroing_group_ids: tuple[int, ...] = ()) -> Any:
        """Pages for the request's next tokens as vLLM blocks; None (nothing changed) when they do not fit."""
        if num_new_tokens == 0 and num_new_computed_tokens == 0 and num_external_computed_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0 when there are no computed tokens to adopt")
        if num_encoder_tokens:
            raise UnsupportedVllmConfig(feature="encoder_tokens", detail="cross-attention (encoder) tokens")
        if not request.num_tokens:  # an empty prompt: hkv has no request without a token (nothing changed)
            return None
        entry = self._entry(request)
        computed = request.num_computed_tokens + num_new_computed_tokens + num_external_computed_tokens
        target = min(computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        size = self._block_tokens
        if (entry.acquired and not num_external_computed_tokens and self._covered(entry, target)
                and not self._commit_due(entry, _written(request))):
            self._in_flight(request, computed, num_new_tokens)
            return self.empty_kv_cache_blocks  # pages cover it, no block completed: hkv is asked nothing
        self._sync(entry, request)
        written = _written(request)  # the step after it: in flight, or this one
        self._commit_to(entry, written, request.num_computed_tokens if request.num_computed_tokens > written
                        else computed + num_new_tokens)
        hit_ids = self._adopted_hit(entry, num_new_computed_tokens)
        watermark = self.watermark_blocks if has_scheduled_reqs and _waiting(request) else 0
        full = min(request.num_tokens, self.max_model_len)
        if full_sequence_must_fit and not self._fits(self._blocks_needed(entry, full, hit_ids, admission=True),
                                                     watermark, 0):
            self._unfit_hit(entry, hit_ids)
            return None  # the whole sequence would not fit (reservations constrain only this allocation)
        checkpoint = self.checkpoints.at(request, entry.blocks, computed, computed + num_new_tokens)
        # a snapshot of a state block (sub-block hits) is taken only where it fits: without it the step still runs,
        # and only the point inside the block is not kept
        snapshot = self._snapshot_due(entry, request, computed, computed + num_new_tokens) and self._fits(
            self._blocks_needed(entry, target, hit_ids, checkpoint=checkpoint, snapshot=True), watermark,
            reserved_blocks)
        if not self._fits(self._blocks_needed(entry, target, hit_ids, checkpoint=checkpoint), watermark,
                          reserved_blocks):
            self._unfit_hit(entry, hit_ids)
            return None
        # whole pages, as vLLM allocates whole blocks: hkv's allocation runs to the end of the last block, past
        # the known tokens where it must (slots reserved ahead: drafts, lookahead, async scheduling's next token)
        end = min(-(-target // size) * size, self.hkv.config.max_request_tokens)
        blocks = self._allocate(entry, end, hit_ids, num_new_computed_tokens, skip_zeroing_group_ids, checkpoint,
                                computed if snapshot or not self.sub_block_hits else -1)
        if blocks is not None and (delay_cache_blocks or num_external_computed_tokens):
            # a connector's load: vLLM counts its tokens computed now.  An async one is written when vLLM reports
            # it (`cache_blocks`); a sync one once the step that loads it is reported written (under async
            # scheduling the next step is scheduled, and the load counted written, before that)
            entry.unconfirmed = (computed - num_external_computed_tokens,
                                 None if delay_cache_blocks else computed + num_new_tokens)
        if blocks is not None:
            self._in_flight(request, computed, num_new_tokens)
        return blocks

    def _unfit_hit(self, entry: Entry, hit_ids: list[list[int]]) -> None:
        """A new request's hit does not fit while no request holds a block: the hit's own blocks (cached ones it
        pins, the copies of its partial blocks, the states it keeps) are what the cache lacks, and no step would
        ever free more.  Its next lookups take no hit (it computes from the start, as a request that fits without
        one), so vLLM's scheduler never waits on it forever."""
        if any(hit_ids) and not self.blocks.held:
            self.unfit_hits.add(entry.req_id)

    def _commit_due(self, entry: Entry, written: int) -> bool:
        """Whether hkv must hear of tokens written since the last commit: a block completed, or (state columns)
        the request left the block whose state its last commit kept, which it need not hold any longer (vLLM
        frees the previous state block one step after the copy from it)."""
        size = self._block_tokens
        return written // size > entry.committed // size or (
            self.stateful and written > entry.committed and entry.committed % size == 0)

    def _in_flight(self, request: Any, computed: int, num_new_tokens: int) -> None:
        """The step computes the request's tokens from `computed` on: its prompt blocks among them are in flight;
        a step that ends on a state block's boundary leaves the state there (`take_boundary_state_offloads`)."""
        if self.state_groups and self.enable_caching:
            self._offer_states(request.request_id, computed, computed + num_new_tokens)
        if self.wait_for_shared_prefills and computed < request.num_prompt_tokens:
            self.prefills_in_flight.record(request.block_hashes, computed, computed + num_new_tokens,
                                           request.num_prompt_tokens)

    def _covered(self, entry: Entry, tokens: int) -> bool:
        """Whether the request's blocks in every group already cover `tokens` (one test when every group's
        block is one hkv block: the hot path of a decode step)."""
        if self.vllm_layout.uniform:
            return -(-tokens // self._block_tokens) <= len(entry.blocks[0])
        return all(g.blocks_for(tokens) <= len(entry.blocks[g.group_id]) for g in self.groups)

    def _allocate(self, entry: Entry, target: int, hit_ids: list[list[int]], hit_tokens: int,
                  skip_zeroing: tuple[int, ...] = (), checkpoint: int = 0, step_start: int = -1) -> Any:
        """Pages to `target` as vLLM blocks (None: nothing changed); a prefill checkpoint (`checkpoints.py`) splits
        the allocation there, so the state groups take its column too."""
        acquiring = not entry.acquired
        if acquiring and hit_tokens:
            assert entry.hit is not None
            try:
                self.hkv.acquire(entry.rid, entry.hit)
            except StaleLease:
                self._forget(entry)
                return None
            for group, ids in zip(self.groups, hit_ids, strict=True):
                self.blocks.take(entry, group.group_id, ids)
        entry.acquired = True
        _, allocated, _ = self.hkv.request_tokens(entry.rid)
        if target <= allocated:
            return self.empty_kv_cache_blocks
        parts = [checkpoint - allocated, target - checkpoint] if allocated < checkpoint else [target - allocated]
        start = step_start if 0 <= step_start <= allocated else None  # (a connector's load: past hkv's allocation)
        allocs = []
        for count in parts:
            try:
                try:
                    allocs.append(self.hkv.allocate_ahead(entry.rid, count, start))
                except OutOfPages:
                    if start is None:
                        raise
                    allocs.append(self.hkv.allocate_ahead(entry.rid, count))  # without a snapshot (nothing changed)
            except OutOfPages:  # nothing scheduled: a new request is forgotten (its hit, a first part released);
                if acquiring:  # a running one's first part stays in hkv's table, vLLM gets it with its next blocks
                    self._forget(entry)
                    self._unfit_hit(entry, hit_ids)
                return None
        if checkpoint > allocated:
            entry.exports.append(checkpoint)
        # a fine hit's partial last block: copied on write
        copied = [pair for alloc in allocs for pair in self.copies.apply(entry, alloc, step_start)]
        new = []
        for group in self.groups:
            table = allocs[-1].block_tables[group.pool][len(entry.blocks[group.group_id]):]
            new.append(self.blocks.take(entry, group.group_id, group.block_ids(table)))
        self._to_zero([(g, b.block_id) for g, blocks in enumerate(new) for b in blocks] + copied, skip_zeroing)
        self._drop_out_of_window(entry)
        return self.create_kv_cache_blocks(tuple(new))

    def _to_zero(self, blocks: list[tuple[int, int]], skip: tuple[int, ...] = ()) -> None:
        """Queue for zeroing the (group, block id) pairs of groups vLLM zeroes (a mixed-precision cache: a block
        entering a group may hold another group's bytes; `skip`: groups an async load writes)."""
        self.new_block_ids += [block for g, block in blocks if block and self.zeroing[g] and g not in skip]

    def _hit_ids(self, hit: Hit) -> list[list[int]]:
        """Per group, the vLLM block ids of hkv's hit, one per block of it (the null block before a window; a
        ring's none: a hit reads nothing of it)."""
        out = []
        for group in self.groups:
            blocks = 0 if group.ring else -(-hit.tokens // group.block_size)  # a fine hit's partial last block
            ids = group.block_ids(hit.pages[group.pool])
            assert len(ids) <= blocks, (group, len(ids), blocks)
            out.append([0] * (blocks - len(ids)) + ids)
        return out

    def _adopted_hit(self, entry: Entry, hit_tokens: int) -> list[list[int]]:
        """The hit's block ids per group when vLLM adopts `hit_tokens` cached tokens (it must be hkv's hit)."""
        if entry.acquired or not hit_tokens:
            return [[] for _ in self.groups]
        if entry.hit is None or entry.hit.tokens != hit_tokens:
            raise InvalidRequestState(request_id=entry.rid, action="allocate_slots",
                                      reason=f"{hit_tokens} computed tokens adopted, hkv's hit has "
                                             f"{entry.hit.tokens if entry.hit else 0}")
        return self._hit_ids(entry.hit)

    def _snapshot_due(self, entry: Entry, request: Any, start: int, end: int) -> bool:
        """Whether hkv takes a snapshot of the state blocks for a step [start, end) (sub-block hits: the step
        starts at the prompt's point inside a block, which it overwrites: `copies.py`)."""
        size = self.state_block
        if not self.sub_block_hits or not entry.acquired or not start % size or start % self._block_tokens:
            return False
        committed, allocated, _ = self.hkv.request_tokens(entry.rid)
        return (committed < start == allocated and start <= request.num_prompt_tokens
                and (end - 1) // size == (start - 1) // size)

    def _blocks_needed(self, entry: Entry, tokens: int, hit_ids: list[list[int]],
                       admission: bool = False, checkpoint: int = 0, snapshot: bool = False) -> list[int]:
        """Per group, the free blocks an allocation to `tokens` takes: new pages, and hit blocks no live request
        holds (and a prefill checkpoint's column per state group).  `admission` (the whole sequence must fit): a
        window group needs at most vLLM's admission cap, as its blocks are given back while the sequence is
        computed (`max_admission_blocks_per_request`)."""
        partial = entry.hit.tokens if entry.hit is not None and any(hit_ids) else 0  # a fine hit's last block: copied
        caps = self._admission_caps if admission else self._no_caps
        return [g.new_blocks(tokens, len(entry.blocks[g.group_id]) + len(ids), cap)
                + sum(1 for i in ids if i and self.blocks.by_id[i].ref_cnt == 0) + int(partial % g.block_size > 0)
                + int(bool(checkpoint) and g.state) + int(snapshot and g.state)
                for g, ids, cap in zip(self.groups, hit_ids, caps, strict=True)]

    def _fits(self, needed: list[int], watermark: int, reserved: int) -> bool:
        """Every group's need, with the watermark, within the free blocks less those reserved (one space)."""
        return sum(needed) + watermark <= self.block_pool.get_num_free_blocks() - reserved

    # ------------------------------------------------------------------ commit and free

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        """vLLM reports `num_computed_tokens` written (after a connector's load, the tokens it loaded; after a
        failed one, the valid prefix): hkv publishes what they complete."""
        entry = self.entries.get(request.request_id)
        if entry is not None:
            if entry.unconfirmed is not None and entry.unconfirmed[1] is None:
                entry.unconfirmed = None  # an async load's outcome (a sync load is confirmed by its step alone)
            if self.enable_caching:
                self._sync(entry, request)
                self._commit_to(entry, min(num_computed_tokens, _written(request)))

    def free(self, request: Any) -> None:
        """The request finished or was preempted: commit what it computed, release it in hkv."""
        if request.is_finished():  # (a preempted request's hit still would not fit)
            self.unfit_hits.discard(request.request_id)
        entry = self.entries.get(request.request_id)
        if entry is None:
            return
        if entry.acquired:  # (a load vLLM never confirmed publishes nothing: `_commit_to`)
            self._sync(entry, request)
            self._commit_final(entry, request)
        self._forget(entry)

    def pop_blocks_for_free(self, request: Any) -> list[Any]:
        """The request is done but a step still in flight may write its blocks: commit what it computed and
        hand vLLM its blocks; they stay held in hkv until vLLM returns them (`block_pool.free_blocks`)."""
        entry = self.entries.get(request.request_id)
        if entry is None:
            return []
        if entry.acquired:  # (first: a call that raises leaves the entry where it was)
            self._sync(entry, request)
            self._commit_final(entry, request)
        blocks = [b for group in entry.blocks for b in group if not b.is_null]
        if not blocks:
            self._forget(entry)
            return []
        del self.entries[request.request_id]
        self.deferred[tuple(map(id, blocks))] = entry
        return blocks

    def free_deferred(self, blocks: list[Any]) -> bool:
        """Release the request whose blocks `pop_blocks_for_free` handed out (in either order); False when
        these blocks are no such request's."""
        if self.copies.release(blocks):  # the blocks of copies vLLM's worker ran
            return True
        key = tuple(map(id, blocks))
        key = key if key in self.deferred else key[::-1]
        entry = self.deferred.get(key)
        if entry is None:
            return False
        self._release(entry)  # (first: a call that raises leaves the request deferred)
        del self.deferred[key]
        return True

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        """vLLM reports `processed_computed_tokens` written (no step in flight writes or reads below them;
        before it hands a finished request's blocks to a KV connector): hkv commits them, which drops the
        blocks that left a window (`_drop_out_of_window`), so the connector is handed the null block there."""
        entry = self.entries.get(request_id)
        if entry is not None:
            self._commit_to(entry, processed_computed_tokens)

    def evict_blocks(self, block_ids: set[int]) -> None:
        """Drop the given blocks from the prefix cache (vLLM asks after a connector reported them unloaded).

        hkv commits a block only once vLLM reports it computed, and vLLM reports a failed load before it
        reports those tokens computed, so the blocks it names are never in hkv's cache: there is nothing
        to evict.  A block hkv did publish is refused (UnsupportedVllmConfig), never silently kept."""
        cached = [i for i in sorted(block_ids) if self._published(i)]
        if cached:
            raise UnsupportedVllmConfig(feature="evict_blocks",
                                        detail=f"evicting blocks {cached} that hkv published (only unpublished "
                                               "blocks, those of a failed connector load, are served)")

    def reset_prefix_cache(self) -> bool:
        """Empty hkv's index (False while a request holds blocks, as vLLM answers)."""
        if self.blocks.held:
            return False
        for entry in list(self.entries.values()):
            self._forget(entry)
        self.hkv.clear_cache()
        if self.log_stats:
            assert self.prefix_cache_stats is not None
            self.prefix_cache_stats.reset = True
        return True

    # ------------------------------------------------------------------ views

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0] * self.num_kv_cache_groups

    def take_events(self) -> list[Any]:
        if not self.enable_kv_cache_events:
            return []
        return vllm_events(self.hkv.take_events(), self.kv_cache_config)

    def get_blocks(self, request_id: str) -> Any:
        entry = self.entries.get(request_id)
        return self.create_kv_cache_blocks(tuple(list(b) for b in entry.blocks) if entry else
                                           tuple([] for _ in self.groups))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()  # type: ignore[no-any-return]

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> tuple[list[int], ...]:
        return tuple(ids[:g.blocks_for(num_computed_tokens)]
                     for g, ids in zip(self.groups, self.get_block_ids(request_id), strict=True))

    def estimate_cached_tokens(self, request: Any) -> int:
        entry = self.entries.get(request.request_id)
        return self.hkv.request_tokens(entry.rid)[0] if entry is not None and entry.acquired else 0

    def create_kv_cache_blocks(self, blocks: tuple[list[Any], ...]) -> Any:
        return self._KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def truncate_computed_blocks(self, blocks: Any, num_computed_tokens: int) -> Any:
        assert all(num_computed_tokens % g.block_size == 0 for g in self.groups if not g.ring)
        return self.create_kv_cache_blocks(tuple(list(b[:0 if g.ring else num_computed_tokens // g.block_size])
                                                 for g, b in zip(self.groups, blocks.blocks, strict=True)))

    def take_new_block_ids(self) -> list[int]:
        """The blocks that entered a group vLLM zeroes since the last call (with one block space a block may pass
        from a group of one precision to another's: vLLM's worker zeroes them before the step reads them)."""
        found, self.new_block_ids = self.new_block_ids, []
        return found

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """A connector's load failed from `start_token` on: the request's blocks from there are zeroed again."""
        entry = self.entries.get(request_id)
        if entry is not None:
            self._to_zero([(g.group_id, b.block_id) for g in self.groups if not g.ring
                           for b in entry.blocks[g.group_id][start_token // g.block_size:]])

    def take_kv_cache_block_copies(self) -> tuple[list[Any], list[Any]]:
        """The copies of fine hits' partial blocks queued since the last call, and the blocks they hold (vLLM
        returns those through `block_pool.free_blocks`); none without fine hits."""
        return self.copies.take()

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """{request id: [(Mamba group, block id, tokens), ...]}: the state blocks steps scheduled since the last call
        leave at a block boundary (the state after `tokens` once the step ran), for a KV connector to save, as
        vLLM's manager offers the blocks it caches; none of a request freed since."""
        found, self.state_offers = self.state_offers, {}
        return found

    def _offer_states(self, req_id: str, start: int, end: int) -> None:
        """The step computes [start, end): where it leaves a state on a boundary of the state groups' blocks (its
        end, its prefill checkpoint), each group's block of that column."""
        entry = self.entries.get(req_id)
        if entry is None or not end:
            return
        for position in [x for x in entry.exports if start < x < end] + [end]:
            for group in self.state_groups:
                column = position // group.block_size - 1
                if position % group.block_size == 0 and column < len(entry.blocks[group.group_id]):
                    block = entry.blocks[group.group_id][column]
                    if not block.is_null:
                        self.state_offers.setdefault(req_id, []).append((group.group_id, block.block_id, position))

    def finalize_partial_tail_offloads(self, request: Any) -> list[tuple[int, int, int]]:
        """[(Mamba group, block id, tokens), ...] once per request (sub-block hits): a request finishing with no step
        in flight, its last step ended inside a state block on a hash block of its prompt, leaves the state there
        in that block, for a KV connector to save before the request is freed (as vLLM's producer partial tail)."""
        entry, t = self.entries.get(request.request_id), int(request.num_computed_tokens)
        if (entry is None or entry.tail_offered or not self.sub_block_hits or request.num_in_flight_tokens
                or not t % self.state_block or t % self._block_tokens or not 0 < t <= request.num_prompt_tokens):
            return []
        entry.tail_offered = True
        column = (t - 1) // self.state_block
        return [(g.group_id, b.block_id, t) for g in self.state_groups
                if column < len(entry.blocks[g.group_id]) and not (b := entry.blocks[g.group_id][column]).is_null]

    def new_step_starts(self) -> None:
        """A step is being scheduled: the oldest step's prompt blocks in flight are written by now."""
        self.prefills_in_flight.next_step()

    # ------------------------------------------------------------------ helpers

    def _entry(self, request: Any) -> Entry:
        entry = self.entries.get(request.request_id)
        if entry is None:
            # at most hkv's max_request_tokens (max_model_len + 1): vLLM never computes past max_model_len, even
            # for a longer prompt (its front ends refuse one; its scheduler takes it and stops there)
            tokens = list(request.all_token_ids)
            del tokens[self.hkv.config.max_request_tokens:]
            salt, lora, mm = request_keys(request, self._block_tokens)
            try:
                rid = self.hkv.add_request(tokens, cache_salt=salt, lora_id=lora, mm_keys=mm)
            except InvalidTokens:  # ids outside hkv's [0, 2**31), e.g. -1 placeholders: vLLM hashes any int
                items = _out_of_range_items(tokens)
                if not items:
                    raise
                rid = self.hkv.add_request(tokens, cache_salt=salt, lora_id=lora, mm_keys=mm + items)
            entry = self.entries[request.request_id] = Entry(req_id=request.request_id, rid=rid,
                                                                known=len(tokens), groups=len(self.groups))
        return entry

    def _sync(self, entry: Entry, request: Any) -> None:
        """Give hkv the request's written tokens it lacks (decode outputs).  Only written ones: vLLM may still
        replace a token past them (a streaming session drops its last sampled token for the next input)."""
        tokens = request.all_token_ids
        upto = min(len(tokens), _written(request), self.hkv.config.max_request_tokens)
        if upto > entry.known:
            more = list(tokens[entry.known:upto])
            try:
                self.hkv.append_tokens(entry.rid, more)
            except InvalidTokens:  # an id outside [0, 2**31): hkv knows the tokens before it only, the rest are
                # slots reserved ahead (served, never cached); the next call stops at the same token
                more = more[:next((i for i, t in enumerate(more) if not 0 <= t < TOKEN_ID_LIMIT), len(more))]
                if more:
                    self.hkv.append_tokens(entry.rid, more)
            entry.known += len(more)

    def _commit_to(self, entry: Entry, num_computed_tokens: int, next_end: int | None = None,
                   final: bool = False) -> None:
        """Commit the tokens vLLM reports computed and hkv knows.  hkv's allocation runs to a block's end or
        to the known tokens, whichever is first; tokens decoded into a block since are first allocated there
        (inside pages the request holds: no page is taken).

        With sub-block state hits, a step that ended inside a state block on a hash block's end is committed
        there only when the request's next step (ending at `next_end`) leaves that block, or the request ends
        (`final`): hkv then keeps the point on the block, which the request never writes again.  Otherwise
        one token short, keeping no point there: vLLM's block table for a running request only grows, so the
        request's next step must write that block (hkv takes a snapshot of it instead: `copies.py`)."""
        if not entry.acquired:
            return
        t, size = num_computed_tokens, self.state_block
        if (self.sub_block_hits and not final and t % self._block_tokens == 0 and t % size
                and (next_end is None or (next_end - 1) // size == (t - 1) // size)):
            num_computed_tokens -= 1
        if entry.unconfirmed is not None:  # a connector's load: nothing of it until vLLM confirms it written
            first, end = entry.unconfirmed
            if end is not None and num_computed_tokens >= end:
                entry.unconfirmed = None
            else:
                num_computed_tokens = min(num_computed_tokens, first)
        computed, allocated, known = self.hkv.request_tokens(entry.rid)
        upto = min(num_computed_tokens, known, allocated)
        if self.stateful and upto < num_computed_tokens:
            return  # hkv keeps a state where a commit ends: only where a step ended (a later commit covers these)
        if upto > computed:
            if not self.copies.settle(entry.rid, upto):  # a copy vLLM's worker has not run: later
                return
            for end in [x for x in entry.exports if computed < x < upto] + [upto]:  # a step's prefill checkpoint:
                self.hkv.commit(entry.rid, end - computed)  # committed as where a step ended (`checkpoints.py`)
                computed = end
            self._drop_out_of_window(entry)
        entry.exports = [x for x in entry.exports if x > upto]
        entry.committed = max(computed, upto)

    def _commit_final(self, entry: Entry, request: Any) -> None:
        """Commit what a request vLLM is done with computed (a step still in flight ends at its computed tokens)."""
        written = _written(request)
        in_flight = request.num_computed_tokens > written
        self._commit_to(entry, written, request.num_computed_tokens if in_flight else None, final=not in_flight)

    def _drop_out_of_window(self, entry: Entry) -> None:
        """The null block for each block hkv dropped from a sliding-window group's table (left the window)."""
        if not self.windowed:
            return
        tables = self.hkv.tables(entry.rid)
        for group in self.windowed:
            table, g = tables[group.pool], group.group_id
            first = entry.live[g]
            while first < min(len(table), len(entry.blocks[g])) and table[first] == 0:
                self.blocks.to_null(entry, g, first)
                first += 1
            entry.live[g] = first

    def _published(self, block_id: int) -> bool:
        """Whether vLLM block `block_id` is a page hkv published (InvalidArgument for an id of no block)."""
        if not isinstance(block_id, int) or not 0 <= block_id < self.blocks.num_blocks:
            raise InvalidArgument(action="evict_blocks", argument="block_ids", value=block_id,
                                  reason=f"not a block id in [0, {self.blocks.num_blocks})")
        states = {self.hkv.pages(group.pool, [block_id]).states[0] for group in self.groups} if block_id else set()
        return bool(states & {"PUBLISHED", "RETIRED"})  # the group holding it (a block is one group's at a time)

    def _forget(self, entry: Entry) -> None:
        self._release(entry)
        del self.entries[entry.req_id]
        self.state_offers.pop(entry.req_id, None)

    def _release(self, entry: Entry) -> None:
        if self.copies.open:
            self.copies.cancel(entry.rid)
        self.hkv.release(entry.rid)  # when it raises, the blocks stay counted and the entry stays
        self.blocks.drop(entry)


def _out_of_range_items(tokens: list[int]) -> tuple[tuple[int, bytes], ...]:
    """Set each id outside hkv's [0, 2**31) to 0 in `tokens` and key it as an item at its offset (hkv mixes an
    item into its block's key and every later one), so hkv's keys tell the ids apart as vLLM's hashes do.  The
    item's bytes start with 0xff, which no UTF-8 text holds, so no multimodal identifier equals one."""
    items = []
    for i, t in enumerate(tokens):
        if not 0 <= t < TOKEN_ID_LIMIT:
            items.append((i, b"\xfftoken " + str(t).encode()))
            tokens[i] = 0
    return tuple(items)


def _written(request: Any) -> int:
    """Tokens whose KV is written: vLLM's computed tokens less those of steps still in flight (async scheduling
    counts a step's tokens computed when it is scheduled)."""
    return int(request.num_computed_tokens - request.num_in_flight_tokens)


def _waiting(request: Any) -> bool:
    from vllm.v1.request import RequestStatus

    return request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)


def _partial_hash_hits(kv_cache_config: Any, hash_block_size: int) -> bool:
    """vLLM's own rule for sub-block hits (`partial_hash_hits_enabled`: a Mamba group of blocks larger than the hash
    block, and every other group's manager able to look hash blocks up)."""
    from vllm.v1.core.kv_cache_utils import partial_hash_hits_enabled
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

    groups = kv_cache_config.kv_cache_groups
    return bool(partial_hash_hits_enabled(groups, hash_block_size, 1, [
        KVCacheSpecRegistry.get_manager_class(g.kv_cache_spec, getattr(g, "role", None)) for g in groups]))


def _refuse(*, dcp: int, pcp: int) -> None:
    """UnsupportedVllmConfig for what the adapter does not serve yet, before anything is built."""
    if dcp != 1 or pcp != 1:
        raise UnsupportedVllmConfig(feature="context_parallel", detail=f"context parallelism (dcp {dcp}, pcp {pcp})")
