"""Engine: a small serving loop over TinyV4, a CacheManager and an executor.

`generate` serves one request through the cache: match / acquire a prefix hit,
chunked prefill, greedy decode (append_tokens, allocate(1), commit(1)), release.
Every forward pass reads its state from the pools (state_io) and writes its
results back; nothing is carried in Python between steps.  Each allocated
chunk runs in sub-chunks of at most W - 1 tokens (so every new window row is
still in the state the model returns) split at the retained boundaries whose
tail snapshots it must write; chunking never changes the logits.

`recompute` runs the same model with no cache at all; the oracle is
`np.array_equal` between the two.

Fault switches (`faults=Fault.DROP_TAIL`, ...): every state the engine loads
from the pools at P > 0 - at a hit's resume point and at each later sub-chunk
or decode step, all of which resume from the pools - is broken by
`tiny_v4.apply_faults` before the model reads it.  Only for negative tests.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import numpy as np
from numpy.typing import ArrayLike

from hkv_core.block_keys import checked_tokens
from hkv_core.errors import InvalidArgument, InvalidTokens
from hkv_core.executor import Executor
from hkv_core.layout import Layout, load_preset_config
from hkv_core.manager import Allocation, CacheManager, Hit, ManagerConfig
from hkv_core.manager.admit import as_token_array
from hkv_core.tiers.cost import LoadDecision
from hkv_exec_ref.engine import state_io
from hkv_exec_ref.engine.results import TIER_NAMES, ServeResult, cached_by_kind
from hkv_exec_ref.engine.speculative import DraftSpec, Proposer, accepted_count
from hkv_exec_ref.executor import RefExecutor
from hkv_exec_ref.tiny_v4 import Config, Fault, ModelState, TinyV4, state_problems
from hkv_exec_ref.tiny_v4.numerics import F32, I64, to_host
from hkv_tiers.cache_dir import checked_directory, stored_key_seed
from hkv_tiers.disk_store import DiskFaults
from hkv_tiers.link import TierLink, TierOptions
from hkv_tiers.remote_config import RemoteTierConfig

TINY_PRESET = "tiny_v4"
TINY_DEFAULTS: dict[str, Any] = {"default_pool_pages": 512, "retain_every_blocks": 2}
EVICTABLE = ("device", "host", "disk")  # tiers `evict` empties (the shared remote store is not one instance's)
DEFAULT_DISK_BYTES = 1 << 30  # a disk tier's budget when Engine.tiny gets a directory and no budget


@attrs.define
class EngineStats:
    """Totals over every request the engine served."""

    requests: int = 0
    prompt_tokens: int = 0
    computed_tokens: int = 0  # prompt tokens computed (not served from the cache) + decode steps
    generated_tokens: int = 0
    cached_tokens: int = 0
    cached_by_kind: Counter[str] = attrs.field(factory=Counter)
    reasons: Counter[tuple[str, str]] = attrs.field(factory=Counter)  # (layer, code)
    forward_passes: int = 0
    evicted_units: int = 0
    proposed_tokens: int = 0  # draft tokens proposed by speculative steps
    accepted_tokens: int = 0  # of them, accepted by the target
    cached_by_tier: Counter[str] = attrs.field(factory=Counter)  # prompt tokens served from device / host / disk
    decisions: Counter[str] = attrs.field(factory=Counter)  # tier decisions: load / recompute / split / none


class Engine:
    """Serves requests on `model` through `manager` and `executor` (bound here)."""

    def __init__(self, model: TinyV4, manager: CacheManager, executor: Executor, *,
                 faults: Fault = Fault.NONE, check_states: bool = False, tiers: TierOptions | None = None) -> None:
        self.model, self.manager, self.executor = model, manager, executor
        self.config: Config = model.config
        self.layout: Layout = manager.layout
        self.routes = self._state_routes()
        self.addresses = executor.bind(manager.bindings(), manager)
        self.faults, self.check_states = faults, check_states
        self.closed = False
        self.max_step_tokens = self.config.window_tokens - 1
        self.cut_every_block = False  # calls also end at every block boundary (HfEngine: a hit ends a call)
        self.stats = EngineStats()
        assert self.max_step_tokens >= 1, "a window of at least 2 rows"
        # What a tier's records were computed with: the weights, the array library (CuPy's bits are not NumPy's:
        # only instances that compute alike may share records), and the fault switches (a faulted engine's
        # records are not a clean one's).
        xp = getattr(executor.xp, "__name__", type(executor.xp).__name__)
        model_id = f"tiny_v4 seed {model.config.seed} on {xp}" + (f" faults {faults.name}" if faults else "")
        self.tiers: TierLink | None = tiers.link(manager, model_id) if tiers else None

    @classmethod
    def tiny(cls, seed: int = 0, *, faults: Fault = Fault.NONE, check_states: bool = False,
             disk_dir: str | Path | None = None, host_bytes: int = 0, disk_bytes: int = DEFAULT_DISK_BYTES,
             load_policy: str = "cost", compute_flops_per_s: float | None = None,
             disk_faults: DiskFaults | None = None, loads_in_flight: int = 4, executor: Executor | None = None,
             remote: RemoteTierConfig | None = None, **limits: Any) -> Engine:
        """The tiny_v4 layout, a RefExecutor, a CacheManager(ManagerConfig(**limits)) and TinyV4(seed).

        `executor`: another executor to serve through (an unbound hkv_exec_cuda.CudaExecutor: the model then
        computes in its array module, on the GPU with CuPy; docs/cuda_executor.md).

        With `disk_dir` and / or `host_bytes`, block spans are also kept in a host arena of `host_bytes` and a
        disk tier of `disk_bytes` in `disk_dir` (docs/tiers.md); reopening the same directory after `close()`
        or a crash serves from what survived (the key seed is the one stored there).  `load_policy`
        ("cost", "load", "recompute") decides loads at a hit; `compute_flops_per_s` fixes the compute rate the
        cost model otherwise measures; `disk_faults` injects disk faults (tests).

        With `remote` (a RemoteTierConfig naming a Mooncake Store master), records are also shared with every
        instance of the same layout, weights and `key_seed` using that master (docs/remote.md); a hit served
        from it counts in `cached_by_tier["remote"]`.  The key seed must then be given and equal everywhere."""
        layout = Layout.from_preset(TINY_PRESET)
        executor = executor if executor is not None else RefExecutor()
        model = TinyV4(Config.from_hf_config(load_preset_config(TINY_PRESET), seed=seed), xp=executor.xp)
        stored = stored_key_seed(checked_directory(disk_dir, action="Engine.tiny", argument="disk_dir"))
        config = ManagerConfig(**{"key_seed": seed if stored is None else stored, **TINY_DEFAULTS, **limits})
        tiers = None
        if disk_dir is not None or host_bytes or remote is not None:
            tiers = TierOptions(directory=disk_dir, host_bytes=host_bytes, disk_bytes=disk_bytes, policy=load_policy,
                                compute_flops_per_s=compute_flops_per_s, faults=disk_faults,
                                loads_in_flight=loads_in_flight, remote=remote)
        return cls(model, CacheManager(layout, config), executor, faults=faults, check_states=check_states,
                   tiers=tiers)

    def close(self) -> None:
        """Flush the host tier to disk (durably) and release the tiers' directory; the engine serves no more."""
        if self.tiers is not None:
            self.tiers.cache.close()
            self.tiers = None
        self.closed = True

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- serving ----------------------------------------------------------------------------

    def generate(self, prompt_tokens: ArrayLike, max_new_tokens: int, *, chunk_tokens: int | None = None,
                 cache_salt: str | None = None, draft: DraftSpec | None = None) -> ServeResult:
        """Serve one request through the cache; the request is released even on errors.  With `draft`, decode
        speculatively (hkv_exec_ref.engine.speculative): the outputs are the same, the result counts the draft
        tokens proposed and accepted.  InvalidTokens for a prompt that is empty, not 1-D, not integers or past
        the vocabulary; InvalidArgument for a negative `max_new_tokens`, a `chunk_tokens` below 1, a `draft`
        that is not a DraftSpec, and for a prompt and `max_new_tokens` the model's positions or the manager's
        `max_request_tokens` cannot hold (checked before the manager sees the request)."""
        if self.closed:
            raise InvalidArgument(action="generate", argument="engine", value="closed",
                                  reason="this engine was closed (its tiers released); open a new one")
        prompt = _prompt(prompt_tokens, self.config.vocab)
        _count("generate", "max_new_tokens", max_new_tokens, 0)
        self._fits("generate", prompt_tokens, len(prompt), max_new_tokens)
        if chunk_tokens is not None:
            _count("generate", "chunk_tokens", chunk_tokens, 1)
        if draft is not None and not isinstance(draft, DraftSpec):
            raise InvalidArgument(action="generate", argument="draft", value=draft,
                                  reason=f"must be None or a DraftSpec, got {type(draft).__name__}")
        proposer = self._proposer(draft, prompt, max_new_tokens)
        rid = self.manager.add_request(prompt, cache_salt=cache_salt)
        try:
            hit = self.manager.match(rid)
            self.manager.acquire(rid, hit)
            by_tier, decision, recomputed = self._from_tiers(rid, hit, prompt)
            cached = sum(by_tier.values())
            computed = self.manager.request_tokens(rid)[0]  # past `cached` when a failed load was recomputed
            prompt_logits = np.concatenate([*recomputed, self._prefill(rid, prompt, computed,
                                                                       chunk_tokens or len(prompt))])
            tokens, logits, proposed, accepted = self._decode(rid, prompt_logits[-1], max_new_tokens, proposer)
            if self.tiers is not None:
                self.tiers.touch_request(self.manager, rid)
            self._served(rid, cached)
        finally:
            self.manager.release(rid)
        self._count(len(prompt), hit, max_new_tokens, by_tier, decision)
        self.stats.proposed_tokens += proposed
        self.stats.accepted_tokens += accepted
        return ServeResult(tokens=tokens, logits=logits, prompt_logits=prompt_logits, cached_tokens=cached,
                           cached_by_kind=cached_by_kind(self.layout, cached), reasons=hit.codes,
                           reason_details=hit.reasons, proposed_tokens=proposed, accepted_tokens=accepted,
                           cached_by_tier=by_tier, tier_decision=decision)

    def _served(self, rid: int, cached_tokens: int) -> None:
        """Called once a request is served, before its release (HfEngine records which calls built its blocks)."""
        return None

    def recompute(self, prompt_tokens: ArrayLike, max_new_tokens: int) -> ServeResult:
        """The same model with no cache: greedy tokens, then every logit from one full forward pass.
        InvalidTokens and InvalidArgument as `generate` (the model's positions bound the tokens; no manager)."""
        prompt = _prompt(prompt_tokens, self.config.vocab)
        _count("recompute", "max_new_tokens", max_new_tokens, 0)
        self._fits("recompute", prompt_tokens, len(prompt), max_new_tokens)
        logits, state = self.model.forward(prompt, self.model.empty_state())
        tokens: list[int] = []
        for i in range(max_new_tokens):
            tokens.append(int(np.argmax(logits[-1])))
            if i + 1 < max_new_tokens:
                logits, state = self.model.forward(tokens[-1:], state)
        ids = np.array(tokens, np.int64)
        full = to_host(self.model.recompute(np.concatenate([prompt, ids[:-1]]) if max_new_tokens else prompt))
        rows = full[len(prompt) - 1:][:max_new_tokens]
        assert np.array_equal(np.argmax(rows, axis=1), ids), "greedy tokens disagree with full recomputation"
        return ServeResult(tokens=ids, logits=rows, prompt_logits=full[:len(prompt)], cached_tokens=0,
                           cached_by_kind=cached_by_kind(self.layout, 0), reasons=())

    def matches_recompute(self, prompt_tokens: ArrayLike, served: ServeResult) -> bool:
        """One full forward pass over prompt + served tokens: every served logit equal, and every served
        token the greedy choice (so a recomputing greedy run would produce exactly this result)."""
        prompt = _prompt(prompt_tokens, self.config.vocab)
        n = len(served.tokens)
        full = to_host(self.model.recompute(np.concatenate([prompt, served.tokens[:-1]]) if n else prompt))
        rows = full[len(prompt) - 1:][:n]
        return bool(np.array_equal(rows, served.logits) and np.array_equal(np.argmax(rows, axis=1), served.tokens)
                    and np.array_equal(full[served.cached_tokens:len(prompt)], served.prompt_logits))

    def evict(self, tier: str = "device") -> int:
        """Force eviction of every unpinned unit of `tier`: device (manager.evict), host (every record moves to
        disk, or is dropped without one), disk (every record deleted); returns units (blocks, resume points,
        records) evicted.  InvalidArgument for a tier this engine lacks, and for a host or disk tier once
        `close()` released them."""
        if self.closed and tier in EVICTABLE[1:]:
            raise InvalidArgument(action="evict", argument="tier", value=tier,
                                  reason="this engine was closed (its tiers released); open a new one")
        have = EVICTABLE[:1] if self.tiers is None else EVICTABLE[:2 + (self.tiers.cache.disk is not None)]
        if tier not in have:
            raise InvalidArgument(action="evict", argument="tier", value=tier,
                                  reason=f"this engine has only {', '.join(have)}")
        if tier != "device":
            assert self.tiers is not None
            return self.tiers.cache.evict(tier)
        evicted = self.manager.evict()
        self.stats.evicted_units += evicted
        return evicted

    # -- internals --------------------------------------------------------------------------

    def _fits(self, action: str, given: object, prompt_tokens: int, max_new_tokens: int) -> None:
        """InvalidArgument unless the request's tokens fit the model's positions (every token but the last
        generated one is forwarded) and, for `generate`, the manager's `max_request_tokens` (the prompt and
        each generated token but the last are appended to the request)."""
        needed = prompt_tokens + max(0, max_new_tokens - 1)
        limits = [(self.config.max_positions, "the model's max_positions")]
        if action == "generate":
            limits.append((self.manager.config.max_request_tokens, "the manager's max_request_tokens"))
        for limit, name in limits:
            if needed > limit:
                argument, value = (("prompt_tokens", given) if prompt_tokens > limit
                                   else ("max_new_tokens", max_new_tokens))
                raise InvalidArgument(action=action, argument=argument, value=value,
                                      reason=f"a prompt of {prompt_tokens} tokens and {max_new_tokens} new ones "
                                             f"run {needed} tokens through the model, past {name} of {limit}")

    def _from_tiers(self, rid: int, hit: Hit,
                    prompt: I64) -> tuple[dict[str, int], LoadDecision | None, list[F32]]:
        """Tokens served per tier (the device hit, then what the tiers load), the tiers' decision, and the
        logits of an allocation computed because its load plan failed (none otherwise)."""
        device_tokens = hit.tokens
        by_tier = {**dict.fromkeys(TIER_NAMES, 0), "device": device_tokens}
        if self.tiers is None:
            return by_tier, None, []
        plan = self.tiers.plan(self.manager, rid, device_tokens, len(prompt))
        recomputed: list[F32] = []

        def compute(alloc: Allocation) -> None:
            start = alloc.start_tokens
            self._reseed_tails(hit, alloc)  # the failed copy may have written the working tails
            recomputed.append(self._compute(rid, alloc, prompt[start:start + alloc.num_tokens]))

        if plan.decision.loaded_tokens:
            by_tier.update(self.tiers.load(self.manager, self.executor, rid, plan, self._run_plan, compute))
        return by_tier, plan.decision, recomputed

    def _prefill(self, rid: int, prompt: I64, hit_tokens: int, chunk_tokens: int) -> F32:
        outs = []
        for start in range(hit_tokens, len(prompt), chunk_tokens):
            outs.append(self._chunk(rid, prompt[start:start + chunk_tokens]))
        return np.concatenate(outs)

    def _proposer(self, draft: DraftSpec | None, prompt: I64, max_new_tokens: int) -> Proposer | None:
        """The request's proposer: it reads the target's greedy continuation from an uncached run."""
        if draft is None or max_new_tokens < 3:  # a step needs room for one draft and the target's token after it
            return None
        truth = self.model.generate(prompt, max_new_tokens - 1).tokens
        return Proposer(draft, truth, self.config.vocab, self.stats.requests)

    def _decode(self, rid: int, last: F32, max_new_tokens: int,
                proposer: Proposer | None) -> tuple[I64, F32, int, int]:
        """Greedy decoding, one token per step or (with a proposer) speculative steps; returns the tokens,
        their logits, and the draft tokens proposed and accepted."""
        tokens, rows, proposed, accepted = [], [], 0, 0
        if max_new_tokens:
            tokens.append(int(np.argmax(last)))
            rows.append(last)
        while len(tokens) < max_new_tokens:
            self.manager.append_tokens(rid, tokens[-1:])
            k = min(proposer.spec.k, max_new_tokens - len(tokens) - 1) if proposer is not None else 0
            if not k:
                last = self._chunk(rid, np.array(tokens[-1:], np.int64))[-1]
                tokens.append(int(np.argmax(last)))
                rows.append(last)
                continue
            assert proposer is not None
            drafts = proposer.propose(len(tokens), k)
            logits = self._verify(rid, tokens[-1], drafts)
            n = accepted_count(drafts, np.argmax(logits, axis=1))
            self.manager.accept(rid, n)
            self.manager.commit(rid, n + 1)
            tokens += [*drafts[:n].tolist(), int(np.argmax(logits[n]))]
            rows += list(logits[:n + 1])
            proposed, accepted = proposed + k, accepted + n
        logits = np.stack(rows) if rows else np.zeros((0, self.config.vocab), np.float32)
        return np.array(tokens, np.int64), logits, proposed, accepted

    def _verify(self, rid: int, last_token: int, drafts: I64) -> F32:
        """One verification pass over [last_token, *drafts] (the manager's speculative step): logits of each."""
        alloc = self._run_plan(self.manager.propose(rid, drafts))  # the checkpoint copy of the working tail
        assert alloc.num_tokens == len(drafts) + 1, alloc
        p = alloc.start_tokens
        chunk = np.concatenate([np.array([last_token], np.int64), drafts])
        logits, extended = self.model.forward_full(chunk, self._state_at(alloc, p), faults=self._faults(p))
        state_io.write_draft(self.executor, self.routes, alloc, extended, self.config)
        self.stats.forward_passes += 1
        out: F32 = to_host(logits)
        return out

    def _chunk(self, rid: int, tokens: I64) -> F32:
        """allocate -> copies -> forward in sub-chunks (state from the pools each time) -> commit."""
        return self._compute(rid, self._run_plan(self.manager.allocate(rid, len(tokens))), tokens)

    def _compute(self, rid: int, alloc: Allocation, tokens: I64) -> F32:
        """Forward `tokens` into `alloc` (its sub-chunks, state from the pools each time), then commit them."""
        if alloc.start_tokens == 0:
            self._write_initial(alloc)
        outs = []
        for lo, hi in self._steps(alloc):
            outs.append(self._step(alloc, tokens[lo - alloc.start_tokens:hi - alloc.start_tokens], lo))
        self.manager.commit(rid, len(tokens))
        return np.concatenate(outs)

    def _steps(self, alloc: Allocation) -> list[tuple[int, int]]:
        """Sub-chunks of at most W - 1 tokens, cut at every snapshot boundary."""
        start, end = alloc.start_tokens, alloc.start_tokens + alloc.num_tokens
        cuts = sorted({start, end, *(b for b in alloc.snapshots if start < b < end)})
        if self.tiers is not None or self.cut_every_block:  # the tiers store each block's span when it ends
            block = self.layout.block_tokens
            cuts = sorted({*cuts, *range(-(-start // block) * block, end, block)})
        steps = []
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            steps += [(a, min(a + self.max_step_tokens, hi)) for a in range(lo, hi, self.max_step_tokens)]
        assert steps[0][0] == start and steps[-1][1] == end
        return steps

    # -- where the model's state lives in the pools (TinyV4's routing; HfEngine routes K / V for full attention) --

    def _state_routes(self) -> tuple[state_io.LayerRoute, ...]:
        return state_io.routes(self.layout, self.config)

    def _read_state(self, alloc: Allocation, p: int) -> Any:
        return state_io.read_state(self.executor, self.routes, alloc, p, self.config)

    def _write_state(self, alloc: Allocation, p: int, new: Any) -> None:
        state_io.write_state(self.executor, self.routes, alloc, p, new, self.config)

    def _reseed_tails(self, hit: Hit, alloc: Allocation) -> None:
        """Copy the device hit's tail snapshots (still leased) into the working tail pages again, as the
        allocation's copy plan did: a failed tier load costs a recompute from the hit, never a wrong row."""
        if not hit.tokens:
            return
        for name, page in alloc.tail_pages.items():
            if name in hit.pages:
                whole = self.executor.read(name, [int(hit.pages[name][0])])[0]  # (layers, entries, *shape)
                entries = whole.shape[1]
                self.executor.write(name, page * entries + np.arange(entries), np.swapaxes(whole, 0, 1))

    def _write_initial(self, alloc: Allocation) -> None:
        state_io.write_initial_tails(self.executor, self.routes, alloc, self.model.empty_state())

    def _run_plan(self, alloc: Allocation) -> Allocation:
        """Run the allocation's copy plan (if any) on the executor and complete it; the allocation."""
        if alloc.plan is not None:
            self.manager.complete(alloc.plan.plan_id, self.executor.run(alloc.plan))
        return alloc

    def _state_at(self, alloc: Allocation, p: int) -> ModelState:
        """The model's state at P, read from the pools (and checked, with `check_states`)."""
        state: ModelState = self._read_state(alloc, p)
        if self.check_states:
            problems = state_problems(state, self.config)
            assert not problems, f"state read from the pools at P={p}: {problems}"
        return state

    def _faults(self, p: int) -> Fault:
        """The fault switches break every state read from the pools, at P > 0."""
        return self.faults if p > 0 else Fault.NONE

    def _step(self, alloc: Allocation, tokens: I64, p: int) -> F32:
        began = time.perf_counter()
        logits, new = self.model.forward(tokens, self._state_at(alloc, p), faults=self._faults(p))
        self._write_state(alloc, p, new)
        self.stats.forward_passes += 1
        if self.tiers is not None:
            self.tiers.observe_compute(p, new.prefix_tokens, time.perf_counter() - began)
            self.tiers.store(self.manager, self.executor, alloc.request_id, alloc, new.prefix_tokens)
        out: F32 = to_host(logits)
        return out

    def _count(self, prompt_tokens: int, hit: Hit, max_new_tokens: int, by_tier: dict[str, int],
               decision: LoadDecision | None) -> None:
        s, cached = self.stats, sum(by_tier.values())
        s.requests += 1
        s.prompt_tokens += prompt_tokens
        s.cached_tokens += cached
        s.computed_tokens += prompt_tokens - cached + max(0, max_new_tokens - 1)
        s.generated_tokens += max_new_tokens
        s.cached_by_kind.update(cached_by_kind(self.layout, cached))
        s.cached_by_tier.update(by_tier)
        if decision is not None:
            s.decisions[decision.action] += 1
        s.reasons.update((r.layer, r.code) for r in hit.reasons)


def _prompt(tokens: ArrayLike, vocab: int) -> I64:
    """The prompt as int64 ids, checked as the manager checks a prompt (1-D integers, never truncated or
    flattened; at least one token) and against the model's vocabulary: InvalidTokens otherwise."""
    prompt = checked_tokens(as_token_array(tokens))
    if not prompt.size:
        raise InvalidTokens("a prompt needs at least one token", dtype=str(prompt.dtype), shape=prompt.shape)
    top = int(prompt.max())
    if top >= vocab:
        raise InvalidTokens(f"token id {top} is outside the model's vocabulary of {vocab}", dtype=str(prompt.dtype),
                            shape=prompt.shape)
    return prompt.astype(np.int64, copy=False)


def _count(action: str, argument: str, value: object, minimum: int) -> int:
    """`value` as an integer >= `minimum`, else InvalidArgument naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise InvalidArgument(action=action, argument=argument, value=value,
                              reason=f"must be an integer >= {minimum}")
    return int(value)
