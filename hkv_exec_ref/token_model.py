"""What the exact tiny hybrid models share (tiny_linear, tiny_v32): one token at a time, in position order.

`TokenModel.forward` runs `_token` for each token on a copy of the state and returns the logits and the state
after them; `recompute` runs from the empty state (the oracle).  Because every token is computed alone with the
canonical float32 primitives of `tiny_v4.numerics`, logits never depend on chunking or on where a run resumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, Protocol, Self, TypeVar

import numpy as np

from hkv_exec_ref.tiny_v4.numerics import F32, I64, exp32, proj, rms_norm, seq_sum

__all__ = ["TokenModel", "TokenState", "Tokens", "seeded_matrix", "softmax_heads"]

Tokens = Sequence[int] | I64
NORM_EPS = 1e-6


class TokenState(Protocol):
    """A model state at P: how many tokens it follows, and a deep copy."""

    tokens: int

    def copy(self) -> Self: ...


S = TypeVar("S", bound=TokenState)


class TokenModel(Generic[S]):
    """Base of the per-token tiny models: `_token` computes one token's logits and updates the state in place."""

    vocab: int
    n_layers: int
    w: dict[str, F32]  # embed, head, and per layer i: "{i}.norm", "{i}.out" and the mixer's own

    def forward(self, tokens: Tokens, state: S) -> tuple[F32, S]:
        """Logits (n, vocab) of `tokens` at positions state.tokens ..; the state after them (a new object)."""
        out, st = [], state.copy()
        for token in np.asarray(tokens, np.int64).tolist():
            out.append(self._token(int(token), st))
            st.tokens += 1
        logits: F32 = np.stack(out) if out else np.zeros((0, self.vocab), np.float32)
        return logits, st

    def recompute(self, tokens: Tokens) -> F32:
        """Logits of every position from the empty state: the oracle."""
        return self.forward(tokens, self._empty())[0]

    def _token(self, token: int, state: S) -> F32:
        """One token through the residual stack: per layer, RMSNorm, the layer's mixer, its output projection."""
        w = self.w
        x = w["embed"][token][None, :]
        for i in range(self.n_layers):
            h = rms_norm(x, w[f"{i}.norm"], NORM_EPS)
            x = x + proj(self._mix(i, h, state), w[f"{i}.out"])
        logits: F32 = proj(x, w["head"])[0]
        return logits

    def _mix(self, layer: int, h: F32, state: S) -> F32:
        """Layer `layer`'s mixer on the normed token `h` (1, hidden), updating `state`: (1, its output width)."""
        raise NotImplementedError

    def _empty(self) -> S:
        raise NotImplementedError


def seeded_matrix(rng: np.random.Generator, *shape: int) -> F32:
    """A float32 weight matrix scaled by 1 / sqrt(fan-in)."""
    out: F32 = (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
    return out


def softmax_heads(keys: F32, values: F32, q: F32, scale: np.float32) -> F32:
    """Per head h (rows of q): softmax(keys . q_h * scale) over the rows, weighting `values`; heads concatenated,
    every sum sequential."""
    heads = []
    for head in range(q.shape[0]):
        scores = seq_sum(keys * q[head][None, :], axis=1) * scale
        weights = exp32(scores - np.max(scores))
        weights = weights / seq_sum(weights, axis=0)
        heads.append(seq_sum(values * weights[:, None], axis=0))
    out: F32 = np.concatenate(heads)[None, :]
    return out
