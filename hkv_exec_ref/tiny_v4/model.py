"""TinyV4: the exact tiny DeepSeek-V4-style model (docs/v4_cache.md section 7).

`forward(tokens, state)` processes tokens at positions P .. P+n-1 given the resume state
at P (state.py) and returns their logits and the minimal state at P+n. Earlier positions
are read only from the state, never recomputed. Because every step is the canonical
per-token / per-query computation of numerics.py and attention.py, logits served from any
saved state are bit-identical (np.array_equal) to `recompute` of the whole sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from hkv_exec_ref.tiny_v4.attention import Probe
from hkv_exec_ref.tiny_v4.config import Config
from hkv_exec_ref.tiny_v4.faults import Fault, active_faults, apply_faults
from hkv_exec_ref.tiny_v4.layer import LayerContext, layer_forward
from hkv_exec_ref.tiny_v4.numerics import F32, I64, RopeTable, arrays_on, proj, rms_norm, xp_of
from hkv_exec_ref.tiny_v4.state import ModelState
from hkv_exec_ref.tiny_v4.weights import Weights, init_weights

Tokens = Sequence[int] | I64


@attrs.frozen(kw_only=True)
class Generation:
    """Result of greedy decoding: new tokens, logits of every fed position, final state."""

    tokens: I64  # (max_new_tokens,) greedily chosen ids
    logits: F32  # (len(prompt) + max_new_tokens, vocab): logits at every position fed
    state: ModelState  # after prompt and every generated token


class TinyV4:
    """A seeded tiny V4 (default: SWA, CSA r=4 with indexer, HCA r=8) with explicit state."""

    def __init__(self, config: Config | None = None, weights: Weights | None = None, *, xp: Any = None) -> None:
        """`xp`: the array module the model computes in (None: NumPy; CuPy runs it on a GPU,
        docs/cuda_executor.md)."""
        self.config = config if config is not None else Config()
        xp = np if xp is None else xp
        self.xp = xp
        self.weights = arrays_on(weights if weights is not None else init_weights(self.config), xp)
        cfg = self.config
        assert len(self.weights.layers) == cfg.n_layers, "weights do not match config"
        self.layers = tuple(
            LayerContext(
                index=i,
                cfg=cfg,
                spec=spec,
                weights=self.weights.layers[i],
                rope=RopeTable(
                    dims=cfg.rope_dims, base=spec.rope_base, max_positions=cfg.max_positions, xp=xp
                ),
                index_rope=RopeTable(
                    dims=cfg.index_rope_dims, base=spec.rope_base, max_positions=cfg.max_positions, xp=xp
                ),
            )
            for i, spec in enumerate(cfg.layer_specs())
        )

    def empty_state(self) -> ModelState:
        """The resume state at P = 0 (arrays of the model's array module)."""
        state: ModelState = arrays_on(ModelState.empty(self.config), self.xp)
        return state

    def on(self, xp: Any) -> TinyV4:
        """The same model (config and weights) computing in array module `xp` (CuPy: on the current GPU)."""
        return TinyV4(self.config, self.weights, xp=xp)

    def forward(
        self,
        tokens: Tokens,
        state: ModelState,
        *,
        faults: Fault = Fault.NONE,
        probe: Probe | None = None,
    ) -> tuple[F32, ModelState]:
        """Logits (n, vocab) of tokens at P .. P+n-1, and the minimal state at P+n.

        `faults` (plus any active `faults.inject` block) break the given state first.
        """
        logits, extended = self._run(tokens, state, faults=faults, probe=probe)
        return logits, extended.resume_at(extended.prefix_tokens, self.config)

    def forward_full(
        self, tokens: Tokens, state: ModelState, *, faults: Fault = Fault.NONE
    ) -> tuple[F32, ModelState]:
        """Like `forward`, but the state is EXTENDED by the chunk (every row given and every row of the
        chunk kept), so `resume_at(P)` cuts the state at any P the chunk passed (speculative verification:
        the state at the accepted length is known only after the pass)."""
        return self._run(tokens, state, faults=faults, probe=None)

    def recompute(self, tokens: Tokens) -> F32:
        """Logits of the whole sequence from scratch: one chunk, fresh empty state."""
        return self.forward(tokens, self.empty_state())[0]

    def trace(self, tokens: Tokens, *, probe: Probe | None = None) -> ModelState:
        """A full (non-minimal) state of `tokens` holding every row of every position.

        `trace(tokens).resume_at(P, config)` is the minimal state at any P <= len(tokens).
        """
        return self._run(tokens, self.empty_state(), faults=Fault.NONE, probe=probe)[1]

    def state_at(self, tokens: Tokens, prefix_tokens: int) -> ModelState:
        """The minimal resume state after tokens[:prefix_tokens], cut from a full run."""
        assert 0 <= prefix_tokens <= len(tokens), (prefix_tokens, len(tokens))
        if prefix_tokens == 0:
            return self.empty_state()
        return self.trace(tokens).resume_at(prefix_tokens, self.config)

    def generate(
        self, prompt: Tokens, max_new_tokens: int, state: ModelState | None = None
    ) -> Generation:
        """Greedy decoding (argmax, ties to the lowest id) after `prompt`, from `state` (or P=0)."""
        assert max_new_tokens >= 0, max_new_tokens
        logits, state = self.forward(prompt, state if state is not None else self.empty_state())
        all_logits, new_tokens = [logits], []
        for _ in range(max_new_tokens):
            new_tokens.append(int(np.argmax(all_logits[-1][-1])))
            logits, state = self.forward(new_tokens[-1:], state)
            all_logits.append(logits)
        out = np.array(new_tokens, dtype=np.int64)
        return Generation(tokens=out, logits=np.concatenate(all_logits), state=state)

    def _run(
        self, tokens: Tokens, state: ModelState, *, faults: Fault, probe: Probe | None
    ) -> tuple[F32, ModelState]:
        """Forward pass returning the state EXTENDED by the chunk (nothing cut)."""
        cfg = self.config
        ids = np.asarray(tokens, dtype=np.int64)
        assert ids.ndim == 1 and ids.shape[0] >= 1, "a chunk has at least one token"
        assert int(ids.min()) >= 0 and int(ids.max()) < cfg.vocab, "token id out of range"
        assert len(state.layers) == cfg.n_layers, "state of another model"
        state = apply_faults(state, faults | active_faults())
        start = state.prefix_tokens
        positions = np.arange(start, start + ids.shape[0], dtype=np.int64)
        x = self.weights.embed[xp_of(self.weights.embed).asarray(ids)]
        layers = []
        for ctx, layer_state in zip(self.layers, state.layers, strict=True):
            x, extended = layer_forward(ctx, x, positions, layer_state, probe)
            layers.append(extended)
        logits = proj(rms_norm(x, self.weights.final_norm, cfg.norm_eps), self.weights.lm_head)
        new_state = ModelState(prefix_tokens=start + ids.shape[0], layers=tuple(layers))
        return logits, new_state
