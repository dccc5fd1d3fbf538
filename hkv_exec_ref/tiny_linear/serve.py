"""HybridServer: TinyHybrid served through a CacheManager and a RefExecutor, its state routed per pool.

`prefill` serves one prompt through the cache: match / acquire a prefix hit, allocate the rest in chunks
(running each allocation's copy plan first: the hit's recurrent state is copied on write into the request's
working pages), compute each chunk in sub-chunks split at the retained boundaries, write every new K / V row
into its slot, the recurrent state at each boundary into that boundary's snapshot pages and the state at the
chunk's end into the working pages, commit, release.  Nothing is carried in Python between chunks: each one
resumes from the pools alone.  The oracle is `np.array_equal` with `TinyHybrid.recompute`.

`generate` decodes greedily after the prompt, optionally in speculative steps (`propose`, one verification
pass, `accept`): the state after each drafted position goes into the page the manager gave that end, never
into the working state the step read, so a rejected draft leaves it exactly as it was.

Broken variants, for tests only: `skip_state_copy=True` does not run the copy plan, so a resumed request reads
whatever its working pages held instead of the hit's state; `draft_in_place=True` writes a step's state into
the working pages, as engines that leaked draft tokens into recurrent state did (docs/failures.md, F5).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from hkv_core.layout import EntryKind, Layout, ObjectKind, PoolSpec
from hkv_core.manager import Allocation, CacheManager, Hit
from hkv_core.plan import Completion
from hkv_exec_ref.engine.state_io import read_rows
from hkv_exec_ref.executor import RefExecutor
from hkv_exec_ref.tiny_linear.model import HybridState, TinyHybrid, Tokens
from hkv_exec_ref.tiny_v4.numerics import F32
from hkv_tiers.link import TierLink, TierOptions


@attrs.frozen(kw_only=True)
class Generated:
    """Greedy decoding after a prompt: the tokens, the logits of every position computed, the draft counts."""

    cached_tokens: int
    reasons: tuple[tuple[str, str], ...]  # the hit's (validation layer, reason code)
    tokens: np.ndarray  # (new_tokens,)
    logits: F32  # (len(prompt) - cached_tokens + new_tokens - 1, vocab)
    proposed: int
    accepted: int


@attrs.frozen(kw_only=True)
class Served:
    """One prompt served: its cached tokens and the logits of the positions it computed."""

    cached_tokens: int
    logits: F32  # (len(prompt) - cached_tokens, vocab)
    reasons: tuple[str, ...]
    tier_tokens: int = 0  # of the cached tokens, those loaded from the host or disk tier


class HybridServer:
    """Serves TinyHybrid from the pools of `manager` (bound to `executor` here)."""

    def __init__(self, model: TinyHybrid, manager: CacheManager, executor: RefExecutor, *,
                 tiers: TierOptions | None = None, skip_state_copy: bool = False,
                 draft_in_place: bool = False) -> None:
        """`tiers`: host and disk tiers below the device (hkv_tiers): every block and kept point is stored as
        it is computed, and a device miss loads what they hold - a new server on the same directory (a
        restart) serves from them."""
        self.model, self.manager, self.executor = model, manager, executor
        self.skip_state_copy, self.draft_in_place = skip_state_copy, draft_in_place
        executor.bind(manager.bindings(), manager)
        self.tiers: TierLink | None = tiers.link(manager, "tiny_linear") if tiers else None
        layout: Layout = manager.layout
        self.kv_pool = next(p for p in layout.pools if p.object_kind is ObjectKind.COMPRESSED_KV)
        self.state_pools = {p.entry_kind: p for p in layout.pools if p.object_kind is ObjectKind.RECURRENT_STATE}
        full = layout.group(self.kv_pool.group_name).layer_ids
        linear = layout.group(self.state_pools[EntryKind.SSM_STATE].group_name).layer_ids
        assert full == model.config.full_layers and linear == model.config.linear_layers, "layout / model"
        self.full, self.linear = full, linear

    def close(self) -> None:
        """Close the tiers (a disk tier's records stay for the next server on its directory)."""
        if self.tiers is not None:
            self.tiers.cache.close()

    def prefill(self, prompt: Tokens, *, chunk_tokens: int | None = None) -> Served:
        """Serve `prompt` (every position's logits past the hit) and release it."""
        tokens = np.asarray(prompt, np.int64)
        m = self.manager
        rid = m.add_request(tokens)
        hit = m.match(rid)
        m.acquire(rid, hit)
        pieces: list[F32] = []
        loaded = 0
        if self.tiers is not None:
            plan = self.tiers.plan(m, rid, hit.tokens, len(tokens))

            def compute(alloc: Allocation) -> None:  # a failed load plan: the same pages, computed
                self._reseed(hit, alloc)  # the failed copy may have written the working state: the hit's again
                pieces.append(self._compute(tokens, alloc))
                m.commit(rid, alloc.num_tokens)

            if plan.decision.loaded_tokens:
                loaded = sum(self.tiers.load(m, self.executor, rid, plan, self._run, compute).values())
        while (done := m.request_tokens(rid)[0]) < len(tokens):
            count = len(tokens) - done if chunk_tokens is None else min(chunk_tokens, len(tokens) - done)
            alloc = self._run(m.allocate(rid, count))
            pieces.append(self._compute(tokens, alloc))
            m.commit(rid, count)
        if self.tiers is not None:
            self.tiers.touch_request(m, rid)
        m.release(rid)
        logits = np.concatenate(pieces) if pieces else np.zeros((0, self.model.config.vocab), np.float32)
        cached = len(tokens) - len(logits)
        return Served(cached_tokens=cached, logits=logits, reasons=hit.codes, tier_tokens=loaded)

    def generate(self, prompt: Tokens, new_tokens: int, *, drafts: Sequence[int] = (), k: int = 0) -> Generated:
        """Greedy decoding after serving `prompt`; with `k`, in speculative steps of up to k draft tokens taken
        from `drafts` (the proposer: a guess of the continuation, right or wrong), each verified in one pass and
        accepted up to the first wrong guess (`manager.accept`): the state past it is dropped, exactly."""
        tokens = np.asarray(prompt, np.int64)
        m = self.manager
        rid = m.add_request(tokens)
        hit = m.match(rid)
        m.acquire(rid, hit)
        alloc = self._run(m.allocate(rid, len(tokens) - hit.tokens))
        rows = list(self._compute(tokens, alloc))
        m.commit(rid, alloc.num_tokens)
        out = [int(np.argmax(rows[-1]))]
        proposed = accepted = 0
        while len(out) < new_tokens:
            m.append_tokens(rid, out[-1:])
            count = min(k, new_tokens - len(out) - 1)
            if not count:
                alloc = self._run(m.allocate(rid, 1))
                rows.append(self._compute(np.array(out[-1:], np.int64), alloc, offset=alloc.start_tokens)[-1])
                m.commit(rid, 1)
                out.append(int(np.argmax(rows[-1])))
                continue
            guess = np.asarray(drafts[len(out):len(out) + count], np.int64)
            guess = np.concatenate([guess, np.zeros(count - len(guess), np.int64)])
            logits = self._verify(rid, out[-1], guess)
            n = next((i for i in range(count) if int(np.argmax(logits[i])) != int(guess[i])), count)
            m.accept(rid, n)
            m.commit(rid, n + 1)
            out += [*guess[:n].tolist(), int(np.argmax(logits[n]))]
            rows += list(logits[:n + 1])
            proposed, accepted = proposed + count, accepted + n
        m.release(rid)
        return Generated(cached_tokens=hit.tokens, reasons=tuple((r.layer, r.code) for r in hit.reasons),
                         tokens=np.array(out[:new_tokens], np.int64),
                         logits=np.stack(rows), proposed=proposed, accepted=accepted)

    def _verify(self, rid: int, last: int, guess: np.ndarray) -> F32:
        """One speculative step over [last, *guess]: K / V rows into the step's slots, the state after each
        position into the page the manager gave that end (`draft_tails`), never into the working state."""
        alloc = self._run(self.manager.propose(rid, guess))
        chunk = np.concatenate([np.array([last], np.int64), guess])
        start = alloc.start_tokens
        state = self._load(alloc, start)
        out = []
        for offset, token in enumerate(chunk.tolist()):
            logits, state = self.model.forward([token], state)
            out.append(logits[0])
            end = start + offset + 1
            drafted = alloc.tail_pages if self.draft_in_place else alloc.draft_tails.get(end)
            for pages in (drafted, alloc.snapshots.get(end)):
                if pages:
                    self._write_state(state, pages)
        self._write_kv(state, alloc, start, start + len(chunk))
        return np.stack(out)

    def _run(self, alloc: Allocation) -> Allocation:
        if alloc.plan is not None:
            self.manager.complete(alloc.plan.plan_id,
                                  Completion() if self.skip_state_copy else self.executor.run(alloc.plan))
        return alloc

    def _compute(self, tokens: np.ndarray, alloc: Allocation, *, offset: int = 0) -> F32:
        """Tokens [start, end) of `alloc` in sub-chunks cut at its snapshot boundaries (and, with tiers, at every
        block boundary, where the block's records are stored): after each, its K / V rows and the working state
        are in the pools, and the state at a kept boundary in that boundary's snapshot pages."""
        start, end = alloc.start_tokens, alloc.start_tokens + alloc.num_tokens
        state = self._load(alloc, start)
        block = self.manager.layout.block_tokens
        cuts = {b for b in alloc.snapshots if start < b <= end} | {end}
        if self.tiers is not None:
            cuts |= set(range(-(-(start + 1) // block) * block, end + 1, block))
        out, at = [], start
        for cut in sorted(cuts):
            logits, state = self.model.forward(tokens[at - offset:cut - offset], state)
            out.append(logits)
            if cut in alloc.snapshots:
                self._write_state(state, alloc.snapshots[cut])
            self._write_kv(state, alloc, at, cut)
            self._write_state(state, alloc.tail_pages)
            if self.tiers is not None:
                self.tiers.store(self.manager, self.executor, alloc.request_id, alloc, cut)
            at = cut
        return np.concatenate(out)

    def _write_kv(self, state: HybridState, alloc: Allocation, start: int, end: int) -> None:
        """K / V rows of positions [start, end) (inside the allocation) into their slots."""
        rows = np.stack([state.kv[i][start:end] for i in self.full], axis=1)  # (n, layers, 2, 1, head_dim)
        first = start - alloc.start_tokens
        self.executor.write(self.kv_pool.name, alloc.slots[self.kv_pool.name][first:first + end - start], rows)

    def _load(self, alloc: Allocation, start: int) -> HybridState:
        """The state at `start`, read from the pools alone (the empty state at 0)."""
        cfg = self.model.config
        state = HybridState.empty(cfg)
        state.tokens = start
        if start == 0:
            return state
        spec = self.kv_pool
        for at, layer in enumerate(self.full):
            state.kv[layer] = read_rows(self.executor, spec, alloc.block_tables[spec.name], 0, start, at)
        for kind, into in ((EntryKind.CONV_STATE, state.conv), (EntryKind.SSM_STATE, state.ssm)):
            pool = self.state_pools[kind]
            slot = [alloc.tail_pages[pool.name] * pool.entries_per_page]
            for at, layer in enumerate(self.linear):
                into[layer] = self.executor.entries(pool.name, slot, at)[0].astype(np.float32)
        return state

    def _reseed(self, hit: Hit, alloc: Allocation) -> None:
        """Copy the recurrent state at the device hit (its snapshot, still leased) into the working pages again,
        as the allocation's copy plan did: what a failed tier load left there is never read."""
        if not hit.tokens:
            return
        for pool in self.state_pools.values():
            page = self.executor.read(pool.name, [int(hit.pages[pool.name][0])])[:, :, 0]  # (1, layers, *shape)
            self.executor.write(pool.name, [alloc.tail_pages[pool.name] * pool.entries_per_page], page)

    def _write_state(self, state: HybridState, pages: dict[str, int]) -> None:
        for kind, source in ((EntryKind.CONV_STATE, state.conv), (EntryKind.SSM_STATE, state.ssm)):
            pool: PoolSpec = self.state_pools[kind]
            values = np.stack([source[layer] for layer in self.linear])[None]  # (1, layers, *entry_shape)
            self.executor.write(pool.name, [pages[pool.name] * pool.entries_per_page], values)
