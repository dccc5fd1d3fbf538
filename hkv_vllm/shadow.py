"""A shadow of vLLM's worker KV memory for the model-free drive (`drive.py`): every read the model would make is
checked against what was written there.

Without a model there is no KV to compare, but there is its provenance.  The
KV of position p (every layer's) is a function of the request's tokens [0..p]
(and its LoRA adapter), so `ShadowWorker` keeps, per vLLM block id and slot, a
`Record` of the last write there: the group that wrote it, an identity of the
token prefix [0..p] (`Prefixes`: interned, so equal prefixes have one id and
different ones never share it) and p.  Fed each step's `SchedulerOutput`
before the (faked) model runs, it does what vLLM's worker does with it
(`vllm/v1/worker/gpu_model_runner.py`, `_update_states`, which the CPU model
runner inherits):

1. forgets the finished requests (`finished_req_ids`), clears the blocks the
   worker zeroes (`new_block_ids_to_zero`) and runs the block copies
   (`kv_cache_block_copies`: the whole source block's records to the
   destination: `copy_kv_cache_blocks_inplace`), in that order;
2. updates each request's block table per group: a new request's is
   `NewRequestData.block_ids`; a running one appends its `new_block_ids`; one
   in `resumed_req_ids` (back from preemption) has them REPLACE its table.
   The table is append-only otherwise: a sliding window's blocks that the
   scheduler turns into the null block stay in the worker's table (it is
   never told), which is harmless only because the model never reads them;
3. writes: the tokens [s, e) scheduled for the request (s its
   `num_computed_tokens`) go to `table[g][p // block_size]`, slot
   `p % block_size`, in every group g, for all requests of the step;
4. reads: then, for each request and group, every position q < s that some
   token of [s, e) attends to (the group's `ReadRule`) must hold the record
   of the request's own prefix [0..q]: not the null block, not a slot never
   written, not another prefix's or position's KV, not another group's.

Writes before reads, across the whole step: vLLM's attention layers write the
whole batch's KV (`reshape_and_cache`) before any of the batch attends, so a
request may read, at positions below its own s, KV that another request
writes in the same step (stock vLLM's hits on blocks scheduled in the same
step), and a write that clobbers a slot another request reads is caught.  Two
different records written to one slot in one step are a wrong write (but for
a ring, where a request's own later rows overwrite its earlier ones, and
whose reads come before the step's writes: the compressor reads the open
group's rows before it saves the step's).

Block ids name memory, not (group, block) pairs: vLLM's groups share the KV
tensors (one tensor per layer position, `KVCacheTensor.shared_by`), so block
b of group 0 and block b of group 1 are the same bytes.  A record names its
group; a write by one group into a block holding another group's records
wipes them (a block is in one group at a time in a correct allocator).

Read rules (`RULES`, by the group's spec class): full attention and MLA read
every q < s; a sliding window of W tokens lets token t read
[max(0, t - W + 1), t] (vLLM's attention backends run the window as
`(sliding_window - 1, 0)`, e.g. `v1/attention/backends/flash_attn.py`, and
`SlidingWindowManager.get_num_skipped_tokens` skips
`num_computed_tokens - sliding_window + 1` tokens), so the step reads
[max(0, s - W + 1), s); chunked local attention of chunk C lets t read its
chunk [t // C * C, t] (`ChunkedLocalAttentionManager.get_num_skipped_tokens`),
so the step reads [s // C * C, s).  A full-attention spec that the model
computes as a window or in chunks (`FullAttentionSpec.sliding_window`,
`attention_chunk_size`) reads like one.

DeepSeek-V4's groups: its compressor-state groups are `SlidingWindowMLASpec`
windows of one entry per token (`WindowReads`); its compressed MLA group
(`tokens_per_state` > 1: C4 and C128 KV and the indexer's keys) holds one
entry per `tokens_per_state` tokens, written when the last of them is
computed and read by every later token (`CompressedReads`); V4.1's
`CircularBufferSpec` ring is one block per request, position p in slot
p % block_size, and a step from s reads the open compression group's rows
(`RingReads`): a ring another request writes too is a wrong read.

Mamba / Gated DeltaNet groups (`MambaSpec`, align mode: `StateReads`) hold no
KV per position but one state per block column: a step over [s, e) first
copies the state its request left last step (or, new or resumed, in column
(s - 1) // T) into column (e - 1) // T, then writes the state after e there
(`vllm/v1/worker/mamba_utils.py`, `preprocess_mamba`; docs/vllm_mamba.md).
The shadow records a state as the KV of position e - 1 in slot 0 of its
block, and checks that the column a step copies from holds the state of the
request's own prefix [0, s).  A Mamba2 or KDA group's kernel also leaves the
state at a prefill checkpoint c in column cdiv(e, T) - 2 where vLLM's own
rule (`compute_mamba_prefill_checkpoints`) puts one: recorded as the KV of
position c - 1 there (nothing where that column is the null block).

Extension point: another group kind is one `ReadRule` subclass (which positions
a step reads from the cache, `reads`, which positions write an entry,
`writes`, and where a position's entry lives in the request's table,
`locate`) registered in `RULES` under its spec class name.

Out of scope (refused with NotImplementedError where the output shows it):
speculative decoding (`scheduled_spec_decode_tokens`), async scheduling where
a step is scheduled before the previous one's tokens are sampled (a scheduled
token not yet known; vLLM's AsyncScheduler as `drive.run` steps it, each
output in before the next schedule, is served), KV connectors
(`kv_connector_metadata`), compressed sliding windows, bounded window replay,
multimodal inputs and prompt embeddings (the identity is the token ids and
the LoRA adapter only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

NULL_BLOCK = 0  # vLLM's null block: a table entry that holds nothing


@attrs.frozen
class Record:
    """What one slot holds: group `group`'s KV of position `position` of the prefix `prefix` (a `Prefixes` id),
    written by request `writer` in step `step` (and since `copied` into this block by a block copy)."""

    group: int
    prefix: int
    position: int
    writer: str
    step: int
    copied: bool = False


@attrs.frozen(kw_only=True)
class WrongRead:
    """One read of a slot that does not hold what the reading request's prefix wrote there (`why`)."""

    step: int
    req_id: str
    group: int
    position: int
    block: int | None  # None: the request's table has no block there
    slot: int
    expected_prefix: int
    found: Record | None
    why: str


@attrs.frozen(kw_only=True)
class WrongWrite:
    """A write into no block or the null block, or a slot written twice in one step with different KV."""

    step: int
    req_id: str
    group: int
    position: int
    block: int | None
    slot: int
    why: str


# ---------------------------------------------------------------------------------------------- read rules


@attrs.frozen
class ReadRule:
    """Full attention (and MLA): token t reads every position up to t, so a step from s reads [0, s)."""

    def reads(self, start: int, end: int) -> range:
        """The positions below `start` whose entries the tokens [start, end) read from the cache."""
        return range(0, start)

    def writes(self, position: int) -> bool:
        """Whether computing `position` writes an entry (a compressed group writes one per `tokens_per_state`)."""
        return True

    @property
    def wraps(self) -> bool:
        """Whether a request's later positions overwrite its earlier ones' slots (a ring), in one step too: its
        reads then come before the step's writes (the compressor reads the open group's rows, then saves the
        step's; a chunk longer than the ring overwrites what it read)."""
        return False

    def locate(self, position: int, block_size: int) -> tuple[int, int]:
        """(index in the request's block table, slot in that block) of `position`'s entry."""
        return divmod(position, block_size)


@attrs.frozen
class WindowReads(ReadRule):
    """A sliding window of `window` tokens: token t reads [max(0, t - window + 1), t]."""

    window: int

    def reads(self, start: int, end: int) -> range:
        return range(max(0, start - self.window + 1), start)


@attrs.frozen
class ChunkReads(ReadRule):
    """Chunked local attention: token t reads its chunk [t // chunk * chunk, t]."""

    chunk: int

    def reads(self, start: int, end: int) -> range:
        return range(start // self.chunk * self.chunk, start)


@attrs.frozen
class CompressedReads(ReadRule):
    """A compressed MLA group (DeepSeek-V4's C4 / C128 KV and indexer K, `tokens_per_state` > 1): one entry per
    `per_state` tokens, written when the last of them is computed (the entry of positions [k * per_state,
    (k + 1) * per_state) is a function of the prefix up to its last token, so the record is that position's),
    and token t reads every complete entry before it; the open group's tokens are in the compressor-state
    groups (windows) or the ring."""

    per_state: int

    def reads(self, start: int, end: int) -> range:
        return range(self.per_state - 1, start, self.per_state)

    def writes(self, position: int) -> bool:
        return (position + 1) % self.per_state == 0

    def locate(self, position: int, block_size: int) -> tuple[int, int]:
        index, offset = divmod(position, block_size)
        return index, offset // self.per_state


@attrs.frozen
class RingReads(ReadRule):
    """DeepSeek-V4.1's compressor ring (`CircularBufferSpec`): one block per request for its lifetime, position p
    in slot p % block_size (`_ring_slot_mapping_kernel` in vllm/models/deepseek_v41/compressor.py); a step from
    s reads the open compression group's earlier rows [s // ratio * ratio, s) (`ratio` the model's compression
    ratio, its compressed group's `tokens_per_state`).  A ring another request also writes is caught here."""

    ratio: int

    def reads(self, start: int, end: int) -> range:
        return range(start // self.ratio * self.ratio, start)

    def locate(self, position: int, block_size: int) -> tuple[int, int]:
        return 0, position % block_size

    @property
    def wraps(self) -> bool:
        return True


@attrs.frozen
class StateReads(ReadRule):
    """A Mamba / GDN group (align mode): no positions read or written per token; a step reads the state at its
    start from the column its request last wrote and writes the state at its end into column (end - 1) // T
    (`ShadowWorker._check_state`, `_write_state`); with `checkpoint_alignment` (Mamba2, KDA) also the state at
    a prefill checkpoint where vLLM's rule puts one (`compute_mamba_prefill_checkpoints`)."""

    checkpoint_alignment: int = 0

    def reads(self, start: int, end: int) -> range:
        return range(0)

    def writes(self, position: int) -> bool:
        return False


def _per_state(spec: Any) -> int:
    return max(1, int(getattr(spec, "tokens_per_state", 1) or 1))


def _full(spec: Any, ratio: int) -> ReadRule:
    if _per_state(spec) > 1:
        return CompressedReads(_per_state(spec))
    if getattr(spec, "sliding_window", None):  # a full-attention group the model computes as a window
        return WindowReads(int(spec.sliding_window))
    if getattr(spec, "attention_chunk_size", None):
        return ChunkReads(int(spec.attention_chunk_size))
    return ReadRule()


def _window(spec: Any, ratio: int) -> ReadRule:
    if getattr(spec, "bounded_replay", False):
        raise NotImplementedError("a sliding window with bounded replay (vLLM recomputes it after a hit)")
    if _per_state(spec) > 1:
        raise NotImplementedError(f"a compressed sliding window ({_per_state(spec)} tokens per state)")
    return WindowReads(int(spec.sliding_window))


def _chunk(spec: Any, ratio: int) -> ReadRule:
    return ChunkReads(int(spec.attention_chunk_size))


def _ring(spec: Any, ratio: int) -> ReadRule:
    return RingReads(ratio)


def _state(spec: Any, ratio: int) -> ReadRule:
    if spec.mamba_cache_mode != "align" or spec.num_speculative_blocks:
        raise NotImplementedError("a Mamba group outside align mode, or with speculative blocks")
    alignment = spec.prefill_checkpoint_alignment if spec.num_prefill_checkpoint_blocks else None
    return StateReads(checkpoint_alignment=int(alignment or 0))


# The extension point: a spec class name -> its read rule, given the spec and the model's compression ratio.
RULES: dict[str, Callable[[Any, int], ReadRule]] = {
    "FullAttentionSpec": _full,
    "MLAAttentionSpec": _full,
    "SlidingWindowSpec": _window,
    "SlidingWindowMLASpec": _window,
    "ChunkedLocalAttentionSpec": _chunk,
    "CircularBufferSpec": _ring,
    "MambaSpec": _state,
}


def read_rule(spec: Any, *, compress_ratio: int = 1) -> ReadRule:
    """The read rule of a vLLM KV cache spec (NotImplementedError for a kind with none yet); `compress_ratio` is
    the model's (what a ring's reads depend on)."""
    kind = type(spec).__name__
    if kind not in RULES:
        raise NotImplementedError(f"no shadow read rule for a {kind} group (add one to hkv_vllm.shadow.RULES)")
    return RULES[kind](spec, compress_ratio)


def compress_ratio(specs: Iterable[Any]) -> int:
    """The compression ratio a ring serves: the largest `tokens_per_state` of the model's non-ring groups."""
    return max((_per_state(s) for s in specs if type(s).__name__ not in ("CircularBufferSpec", "MambaSpec")),
               default=1)


# ---------------------------------------------------------------------------------------------- prefixes


class Prefixes:
    """Interned token prefixes: the id of tokens[0..p] under `root` (a request's LoRA adapter); equal prefixes under
    one root get one id, any two different ones different ids (a trie of (parent id, token) -> id)."""

    def __init__(self) -> None:
        self._children: dict[tuple[int, int], int] = {}
        self._roots: dict[str, int] = {}
        self._next = 0

    def _new(self) -> int:
        self._next += 1
        return self._next

    def extend(self, root: str, ids: list[int], tokens: Sequence[int], end: int) -> None:
        """Append to `ids` (the ids of a prefix of `tokens`) the ids of positions len(ids) .. end - 1."""
        if ids:
            node = ids[-1]
        elif root in self._roots:
            node = self._roots[root]
        else:
            node = self._roots[root] = self._new()
        for token in tokens[len(ids):end]:
            key = (node, int(token))
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self._new()
            ids.append(child)
            node = child


@attrs.define
class _Request:
    """The worker's view of one request: its block table per group and where its identities stand."""

    table: list[list[int]]
    resumed_at: int  # the computed tokens it (re)started with: positions below came from the prefix cache
    root: str  # what besides the tokens decides its KV (its LoRA adapter)
    tokens: list[int] = attrs.field(factory=list)  # the tokens its `ids` name
    ids: list[int] = attrs.field(factory=list)  # per position p, the id of its prefix [0..p]
    state_columns: dict[int, int] = attrs.field(factory=dict)  # Mamba group -> the column its last step wrote


@attrs.frozen
class _Span:
    """One request's work in a step: tokens [start, end)."""

    req_id: str
    start: int
    end: int


# ---------------------------------------------------------------------------------------------- the worker


class ShadowWorker:
    """vLLM's worker KV memory as records of what was written where; every read of a step is checked."""

    def __init__(self, kv_cache_config: Any, *, details: int = 20, hash_block_size: int = 0,
                 hit_alignment_tokens: int = 0) -> None:
        """`hash_block_size` and `hit_alignment_tokens` (vLLM's cache config): where a Mamba group's kernel puts
        its prefill checkpoints (needed only with such a group)."""
        groups = kv_cache_config.kv_cache_groups
        self.hash_block_size, self.hit_alignment_tokens = hash_block_size, hit_alignment_tokens
        self.block_sizes = tuple(int(g.kv_cache_spec.block_size) for g in groups)
        ratio = compress_ratio(g.kv_cache_spec for g in groups)
        self.rules = tuple(read_rule(g.kv_cache_spec, compress_ratio=ratio) for g in groups)
        self.details = details
        self.slots: dict[int, dict[int, Record]] = {}  # block id -> slot -> the record written there last
        self.requests: dict[str, _Request] = {}
        self.prefixes = Prefixes()
        self.steps = self.reads = self.cached_reads = self.copied_reads = self.writes = self.copies = 0
        self.resumes = self.wrong_reads = self.wrong_writes = self.same_step_reads = self.checkpoints = 0
        self.wrong: list[WrongRead] = []  # the first `details` wrong reads
        self.wrong_written: list[WrongWrite] = []  # the first `details` wrong writes

    @classmethod
    def for_scheduler(cls, scheduler: Any, **kwargs: Any) -> ShadowWorker:
        """A shadow of the worker of `scheduler` (its KVCacheConfig's groups), stock vLLM's or hkv's."""
        hash_block = scheduler.hash_block_size
        alignment = hash_block if getattr(scheduler, "mamba_partial_cache_hit", False) else scheduler.block_size
        return cls(scheduler.kv_cache_config, hash_block_size=hash_block, hit_alignment_tokens=alignment, **kwargs)

    def observe(self, output: Any, tokens: Callable[[str], Sequence[int]]) -> None:
        """Run one step's `SchedulerOutput` as the worker would: copies, tables, writes, then the reads checked.
        `tokens(req_id)` is the request's tokens (prompt and sampled outputs) when the step is scheduled."""
        _refuse(output)
        self.steps += 1
        for req_id in output.finished_req_ids:
            self.requests.pop(req_id, None)
        for block in output.new_block_ids_to_zero or ():
            self.slots.pop(block, None)
        self._copy(output.kv_cache_block_copies or ())
        spans = self._update_tables(output)
        for span in spans:
            self._identify(span, tokens(span.req_id))
        for span in spans:
            self._check_reads(span, before_writes=True)
        written: dict[tuple[int, int], Record] = {}
        for span in spans:
            self._write(span, written)
        for span in spans:
            self._check_reads(span, before_writes=False)

    @property
    def summary(self) -> dict[str, int]:
        """The counts: steps, reads checked (of them from the prefix cache, through a block copy, and of cached
        KV another request wrote in the same step: vLLM's same-step hits), slots written, blocks copied,
        requests resumed from preemption, wrong reads and wrong writes."""
        return dict(steps=self.steps, reads=self.reads, cached_reads=self.cached_reads, copied_reads=self.copied_reads,
                    same_step_reads=self.same_step_reads, writes=self.writes, copies=self.copies,
                    resumes=self.resumes, wrong_reads=self.wrong_reads, wrong_writes=self.wrong_writes)

    def describe(self) -> str:
        """The counts and the first wrong reads and writes, one a line."""
        return "\n".join([str(self.summary), *map(str, self.wrong), *map(str, self.wrong_written)])

    # ------------------------------------------------------------------ the worker's state updates

    def _copy(self, copies: Iterable[Any]) -> None:
        """vLLM's worker copies each whole source block onto its destination before the forward pass."""
        for copy in copies:
            source = self.slots.get(copy.src_block_id, {})
            self.slots[copy.dst_block_id] = {slot: attrs.evolve(r, copied=True) for slot, r in source.items()}
            self.copies += 1

    def _update_tables(self, output: Any) -> list[_Span]:
        """Each scheduled request's block tables as the worker updates them, and its tokens this step."""
        starts = {new.req_id: self._new_request(new) for new in output.scheduled_new_reqs}
        cached = output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            starts[req_id] = self._cached_request(req_id, cached.new_block_ids[i], req_id in cached.resumed_req_ids,
                                                  cached.num_computed_tokens[i])
        return [_Span(r, s, s + output.num_scheduled_tokens[r]) for r, s in starts.items()]

    def _new_request(self, new: Any) -> int:
        lora = new.lora_request
        self.requests[new.req_id] = _Request(table=[list(ids) for ids in new.block_ids],
                                             resumed_at=new.num_computed_tokens,
                                             root=str(lora.lora_name) if lora is not None else "")
        return int(new.num_computed_tokens)

    def _cached_request(self, req_id: str, new_block_ids: Any, resumed: bool, computed: int) -> int:
        request = self.requests.get(req_id)
        if request is None:
            raise KeyError(f"request {req_id} scheduled as running before the shadow saw it scheduled new")
        if resumed:  # back from preemption: its blocks replace the table (the worker asserts they are given)
            request.table = [list(ids) for ids in new_block_ids]
            request.resumed_at = computed
            request.state_columns.clear()
            self.resumes += 1
        elif new_block_ids is not None:
            for table, ids in zip(request.table, new_block_ids, strict=True):
                table.extend(ids)
        return computed

    def _identify(self, span: _Span, tokens: Sequence[int]) -> None:
        """The request's prefix ids up to its span's end (from the first token that changed, if any did)."""
        if len(tokens) < span.end:
            raise NotImplementedError(f"request {span.req_id}: tokens up to {span.end} scheduled, {len(tokens)} "
                                      "known (async scheduling or speculative tokens)")
        request = self.requests[span.req_id]
        known = min(len(request.ids), span.end)
        current = [int(t) for t in tokens[:span.end]]
        if current[:known] != request.tokens[:known]:
            same = next(i for i, (a, b) in enumerate(zip(current, request.tokens, strict=False)) if a != b)
            del request.ids[same:], request.tokens[same:]
        request.tokens.extend(current[len(request.tokens):span.end])
        self.prefixes.extend(request.root, request.ids, request.tokens, span.end)

    # ------------------------------------------------------------------ writes and reads

    def _write(self, span: _Span, written: dict[tuple[int, int], Record]) -> None:
        request = self.requests[span.req_id]
        for group, rule in enumerate(self.rules):
            if isinstance(rule, StateReads):
                self._write_checkpoint(span, request, group, rule.checkpoint_alignment, written)
                self._write_state(span, request, group, written)
                continue
            for position in range(span.start, span.end):
                if not rule.writes(position):
                    continue
                index, slot = rule.locate(position, self.block_sizes[group])
                block = _block_at(request.table[group], index)
                record = Record(group, request.ids[position], position, span.req_id, self.steps)
                self._store(span.req_id, block, slot, record, written, rule.wraps)

    def _store(self, req_id: str, block: int | None, slot: int, record: Record,
               written: dict[tuple[int, int], Record], wraps: bool) -> None:
        self.writes += 1
        if block is None or block == NULL_BLOCK:
            self._wrong_write(req_id, record, block, slot, "no block" if block is None else "the null block")
            return
        earlier = written.get((block, slot))
        if (earlier is not None and (earlier.group, earlier.prefix) != (record.group, record.prefix)
                and not (wraps and earlier.writer == req_id)):
            self._wrong_write(req_id, record, block, slot,
                              f"written in this step by {earlier.writer} (group {earlier.group}) too")
        slots = self.slots.setdefault(block, {})
        if any(r.group != record.group for r in slots.values()):  # the block passed to another group
            slots.clear()
        slots[slot] = written[(block, slot)] = record

    def _write_state(self, span: _Span, request: _Request, group: int, written: dict[tuple[int, int], Record]) -> None:
        """The state after the step's last token, into the column of that token."""
        column = (span.end - 1) // self.block_sizes[group]
        record = Record(group, request.ids[span.end - 1], span.end - 1, span.req_id, self.steps)
        self._store(span.req_id, _block_at(request.table[group], column), 0, record, written, False)
        request.state_columns[group] = column

    def _write_checkpoint(self, span: _Span, request: _Request, group: int, alignment: int,
                          written: dict[tuple[int, int], Record]) -> None:
        """The state at the step's prefill checkpoint, where vLLM's worker puts one, into the column vLLM's rule
        names (a column beyond the table or the null block: the write goes nowhere a reader looks)."""
        if not alignment or span.end - span.start <= self.hash_block_size:
            return
        from vllm.model_executor.layers.mamba.checkpoint import compute_mamba_prefill_checkpoints

        (offset,), (column,) = compute_mamba_prefill_checkpoints(
            [span.end], [span.end - span.start], hash_block_size=self.hash_block_size,
            mamba_block_size=self.block_sizes[group], checkpoint_alignment=alignment, drop_eagle_block=False,
            cache_hit_alignment_tokens=self.hit_alignment_tokens)
        block = _block_at(request.table[group], column) if offset else None
        if block is None or block == NULL_BLOCK:
            return
        position = span.start + offset - 1  # the state after the checkpoint: as the KV of its last token
        record = Record(group, request.ids[position], position, span.req_id, self.steps)
        self._store(span.req_id, block, 0, record, written, False)
        self.checkpoints += 1

    def _check_state(self, span: _Span, request: _Request, group: int) -> None:
        """The column the step copies its starting state from holds the request's own state at its start."""
        if not span.start:
            return
        column = request.state_columns.get(group, (span.start - 1) // self.block_sizes[group])
        block = _block_at(request.table[group], column)
        found = self.slots.get(block, {}).get(0) if block else None
        expected = request.ids[span.start - 1]
        why = _mismatch(block, found, group, expected, span.start - 1)
        self.reads += 1
        self.cached_reads += span.start <= request.resumed_at
        if why:
            self._wrong_read(WrongRead(step=self.steps, req_id=span.req_id, group=group, position=span.start - 1,
                                       block=block, slot=0, expected_prefix=expected, found=found, why=why))
        elif found is not None:
            self.copied_reads += found.copied

    def _check_reads(self, span: _Span, *, before_writes: bool) -> None:
        request = self.requests[span.req_id]
        for group, rule in enumerate(self.rules):
            if isinstance(rule, StateReads) and before_writes:  # the copy runs before the forward pass
                self._check_state(span, request, group)
            if rule.wraps != before_writes:
                continue
            for position in rule.reads(span.start, span.end):
                index, slot = rule.locate(position, self.block_sizes[group])
                block = _block_at(request.table[group], index)
                found = self.slots.get(block, {}).get(slot) if block else None
                why = _mismatch(block, found, group, request.ids[position], position)
                self.reads += 1
                self.cached_reads += position < request.resumed_at
                if why:
                    self._wrong_read(WrongRead(step=self.steps, req_id=span.req_id, group=group, position=position,
                                               block=block, slot=slot, expected_prefix=request.ids[position],
                                               found=found, why=why))
                elif found is not None:
                    self.copied_reads += found.copied
                    self.same_step_reads += (position < request.resumed_at and found.step == self.steps
                                             and found.writer != span.req_id)

    def _wrong_read(self, wrong: WrongRead) -> None:
        self.wrong_reads += 1
        if len(self.wrong) < self.details:
            self.wrong.append(wrong)

    def _wrong_write(self, req_id: str, record: Record, block: int | None, slot: int, why: str) -> None:
        self.wrong_writes += 1
        if len(self.wrong_written) < self.details:
            self.wrong_written.append(WrongWrite(step=self.steps, req_id=req_id, group=record.group,
                                                 position=record.position, block=block, slot=slot, why=why))


def _block_at(table: list[int], index: int) -> int | None:
    return table[index] if index < len(table) else None


def _mismatch(block: int | None, found: Record | None, group: int, prefix: int, position: int) -> str:
    """Why `found`, the record in `block`, is not group `group`'s KV of `prefix` at `position` ('' if it is)."""
    if block is None:
        return "no block in the request's table"
    if block == NULL_BLOCK:
        return "the null block"
    if found is None:
        return "never written"
    if found.group != group:
        return f"group {found.group}'s KV"
    if found.position != position:
        return f"position {found.position}'s KV"
    return "" if found.prefix == prefix else "another prefix's KV"


def _refuse(output: Any) -> None:
    """NotImplementedError for what the shadow does not model yet."""
    if output.scheduled_spec_decode_tokens:
        raise NotImplementedError("speculative decoding (scheduled_spec_decode_tokens)")
    if getattr(output, "kv_connector_metadata", None) is not None:
        raise NotImplementedError("KV connectors (kv_connector_metadata)")
