"""HfEngine: a Hugging Face model served through hkv's CacheManager and executor pools (docs/hf.md).

The serving loop is hkv's Engine: prefill in sub-chunks cut at the manager's retained boundaries (so a call
ends wherever a resume point is kept), every call's state read from the pools and written back.  What differs:
the model is HF's (`HfModel`), and exactness is checked against HF's own cache over the same call boundaries -
HF's outputs depend on how tokens were split into calls (matrix products of different shapes round
differently, and the CSA indexer's top-k flips on near-ties), so `generate` returns every call end that built
its outputs (`boundaries`, those of the requests whose blocks it hit included) and `recompute(...,
boundaries=...)` runs HF over exactly those calls.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import torch
from numpy.typing import ArrayLike

from hkv_core.errors import InvalidArgument
from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig
from hkv_exec_ref.engine.engine import TINY_DEFAULTS, Engine, _count, _prompt
from hkv_exec_ref.engine.results import ServeResult, cached_by_kind
from hkv_exec_ref.executor import RefExecutor
from hkv_exec_ref.hf import llama
from hkv_exec_ref.hf.llama import LlamaModel
from hkv_exec_ref.hf.model import MODELS, HfModel, tiny_hf_model

__all__ = ["HF_BLOCK_TOKENS", "HfEngine"]

HF_BLOCK_TOKENS = 8  # the tiny models' block: the lcm of the ratios (4, 8)
# a resume point at every block: a hit reaches every block an earlier request computed, so fewer blocks are
# computed twice (with other calls, hence other bits: see HfEngine._served)
HF_DEFAULTS: dict[str, Any] = {"retain_every_blocks": 1}


class HfEngine(Engine):
    """hkv's Engine over a transformers model; `boundaries` and `recompute(..., boundaries=)` as above."""

    model: HfModel | LlamaModel  # type: ignore[assignment]  # in TinyV4's place: the same forward / cache calls

    def __init__(self, model: HfModel | LlamaModel, manager: CacheManager, executor: Any, **options: Any) -> None:
        if options.get("tiers") is not None:
            raise InvalidArgument(action="HfEngine", argument="tiers", value=options["tiers"],
                                  reason="host and disk tiers are not offered for HF models")
        super().__init__(model, manager, executor, **options)  # type: ignore[arg-type]
        self.provenance: dict[bytes, tuple[int, ...]] = {}  # block key -> the call ends inside that block
        self.mixed: set[bytes] = set()  # blocks computed on top of a block recomputed with other calls
        self.cut_every_block = True  # any block a later request hits ends a call
        self._boundaries: tuple[int, ...] = ()

    @classmethod
    def tiny(cls, model: str = "deepseek_v4", seed: int = 0, *, index_topk: int = 4,  # type: ignore[override]
             **limits: Any) -> HfEngine:
        """A random-initialized tiny HF `model` (one of MODELS), its layout (`Layout.from_hf_config` of the model's
        own config object), a CacheManager(ManagerConfig(**limits)) and a RefExecutor."""
        if model not in MODELS:
            raise InvalidArgument(action="HfEngine.tiny", argument="model", value=model,
                                  reason=f"one of {', '.join(MODELS)}")
        hf = tiny_hf_model(model, seed, index_topk=index_topk)
        layout = Layout.from_hf_config(hf.config, name=f"hf_{model}", block_tokens=HF_BLOCK_TOKENS)
        config = ManagerConfig(**{"key_seed": seed, **TINY_DEFAULTS, **HF_DEFAULTS, **limits})
        adapter = LlamaModel(hf, seed, HF_BLOCK_TOKENS) if model == "llama" else HfModel(hf, seed)
        return cls(adapter, CacheManager(layout, config), RefExecutor())

    # full attention (llama): K / V per token in one pool, no window or tails
    def _state_routes(self) -> Any:
        return () if isinstance(self.model, LlamaModel) else super()._state_routes()

    def _read_state(self, alloc: Any, p: int) -> Any:
        if isinstance(self.model, LlamaModel):
            return llama.read_state(self.executor, self.layout, alloc, p)
        return super()._read_state(alloc, p)

    def _write_state(self, alloc: Any, p: int, new: Any) -> None:
        if isinstance(self.model, LlamaModel):
            llama.write_state(self.executor, self.layout, alloc, p, new)
        else:
            super()._write_state(alloc, p, new)

    def _write_initial(self, alloc: Any) -> None:
        if not isinstance(self.model, LlamaModel):
            super()._write_initial(alloc)

    def generate(self, prompt_tokens: ArrayLike, max_new_tokens: int, *, chunk_tokens: int | None = None,
                 cache_salt: str | None = None, draft: Any = None) -> ServeResult:
        """Engine.generate (no speculative decoding here), with `boundaries`: every call end from position 0."""
        if draft is not None:
            raise InvalidArgument(action="generate", argument="draft", value=draft,
                                  reason="HfEngine does not decode speculatively")
        self.model.calls.clear()
        served = super().generate(prompt_tokens, max_new_tokens, chunk_tokens=chunk_tokens, cache_salt=cache_salt)
        return attrs.evolve(served, boundaries=self._boundaries)

    def _served(self, rid: int, cached_tokens: int) -> None:
        """Record which calls built each block this request computed; `_boundaries` for its result.

        The index keeps a block's first computation.  A request that computes a block again with other calls
        (its hit stopped short of it) gets other bits, and every block it then adds is built on them: such
        blocks are `mixed` - their state came from two call histories, which no single run of HF reproduces -
        and a later hit through one gets `boundaries=()` (docs/hf.md)."""
        block = self.layout.block_tokens
        ends = [end for _, end in self.model.calls]
        computed_blocks = max(ends, default=0) // block
        keys = [bytes(np.asarray(k).tobytes()) for k in self.manager.block_keys(rid, 0, computed_blocks)]
        hit_blocks = cached_tokens // block
        before: list[int] = []
        for b in range(hit_blocks):
            assert keys[b] in self.provenance, f"block {b} of the hit was not computed by this engine"
            before += self.provenance[keys[b]]
        mixed_hit = any(keys[b] in self.mixed for b in range(hit_blocks))
        diverged = mixed_hit
        for b in range(hit_blocks, computed_blocks):
            own = tuple(e for e in ends if b * block < e <= (b + 1) * block)
            if keys[b] in self.provenance:
                diverged |= self.provenance[keys[b]] != own or keys[b] in self.mixed
            else:
                self.provenance[keys[b]] = own
                if diverged:
                    self.mixed.add(keys[b])
        self._boundaries = () if mixed_hit else (*before, *ends)

    def hf_cache(self, tokens: ArrayLike, ends: tuple[int, ...]) -> Any:
        """HF's own cache after its calls over `tokens` ending at `ends`."""
        from transformers import DynamicCache

        ids = torch.as_tensor(np.asarray(tokens, np.int64))[None]
        cache, pos = DynamicCache(config=self.model.hf.config), 0
        with torch.no_grad():
            for end in ends:
                self.model.hf(input_ids=ids[:, pos:end], past_key_values=cache, use_cache=True)
                pos = end
        return cache

    def restored_cache(self, prompt_tokens: ArrayLike, *, cache_salt: str | None = None) -> tuple[int, Any]:
        """The hit P of `prompt_tokens` now, and the HF cache hkv rebuilds at P from its pools (the request is
        released again, nothing committed)."""
        prompt = _prompt(prompt_tokens, self.config.vocab)
        rid = self.manager.add_request(prompt, cache_salt=cache_salt)
        try:
            hit = self.manager.match(rid)
            self.manager.acquire(rid, hit)
            alloc = self._run_plan(self.manager.allocate(rid, len(prompt) - hit.tokens))
            state: Any = self._state_at(alloc, hit.tokens)  # this model's own state kind (KvState for Llama)
            return hit.tokens, self.model.cache(state)
        finally:
            self.manager.release(rid)

    def recompute(self, prompt_tokens: ArrayLike, max_new_tokens: int, *,
                  boundaries: tuple[int, ...] | None = None) -> ServeResult:
        """HF's model with HF's own cache: calls ending at `boundaries` (None: the prompt in one call, then one
        call per generated token), greedy tokens; `prompt_logits` of every prompt position.  InvalidArgument
        for boundaries that do not rise, leave out the prompt's end, or pass the last token fed."""
        prompt = _prompt(prompt_tokens, self.config.vocab)
        _count("recompute", "max_new_tokens", max_new_tokens, 0)
        ends = list(boundaries) if boundaries is not None else [len(prompt)] + [
            len(prompt) + i for i in range(1, max_new_tokens)]
        last = len(prompt) + max(0, max_new_tokens - 1)
        if (any(b <= a for a, b in zip([0, *ends], ends, strict=False)) or len(prompt) not in ends
                or ends[-1] != last):
            raise InvalidArgument(action="recompute", argument="boundaries", value=boundaries,
                                  reason=f"must rise from 1, include the prompt's end {len(prompt)} and end at "
                                         f"{last} (the last token fed)")
        from transformers import DynamicCache

        rows: list[Any] = []
        cache, seq, pos = DynamicCache(config=self.model.hf.config), list(prompt), 0
        for end in ends:
            while len(seq) < end:
                seq.append(int(np.argmax(rows[-1][-1])))
            with torch.no_grad():
                ids = torch.as_tensor(seq[pos:end], dtype=torch.long)[None]
                rows.append(self.model.hf(input_ids=ids, past_key_values=cache, use_cache=True).logits[0].numpy())
            pos = end
        full = np.concatenate(rows).astype(np.float32)
        while len(seq) < len(prompt) + max_new_tokens:
            seq.append(int(np.argmax(full[len(seq) - 1])))
        tokens = np.array(seq[len(prompt):], np.int64)
        return ServeResult(tokens=tokens, logits=full[len(prompt) - 1:][:max_new_tokens],
                           prompt_logits=full[:len(prompt)], cached_tokens=0,
                           cached_by_kind=cached_by_kind(self.layout, 0), reasons=(), boundaries=tuple(ends))

    def matches_recompute(self, prompt_tokens: ArrayLike, served: ServeResult) -> bool:
        """HF over the served calls (`served.boundaries`) gives the same tokens and logits, bit for bit (False
        when the boundaries are unknown: a hit through a mixed block)."""
        if not served.boundaries:
            return False
        again = self.recompute(prompt_tokens, len(served.tokens), boundaries=served.boundaries)
        return bool(np.array_equal(again.tokens, served.tokens) and np.array_equal(again.logits, served.logits)
                    and np.array_equal(again.prompt_logits[served.cached_tokens:], served.prompt_logits))
