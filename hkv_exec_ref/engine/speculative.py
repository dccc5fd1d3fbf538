"""Speculative decoding in the reference engine: a seeded proposer, verification by the target, greedy accept.

Each step proposes k draft tokens after the last verified token t0; the target
TinyV4 runs [t0, d1 .. dk] in one forward pass from the state read from the
pools; greedy acceptance keeps the longest prefix of drafts equal to the
target's own argmax, then the target's next token.  The manager reserves the
step (`propose`), the engine writes every result (`state_io.write_draft`, the
same whatever is accepted), then `accept(n)` keeps what the target verified
and frees the rest, and `commit` publishes it as in any decode step.

The proposer stands in for a draft model or an MTP head: it is right with
probability `accept_probability` per token by construction (it reads the
target's greedy continuation from an uncached run, and replaces each token,
with probability 1 - p, by another id drawn from a seeded generator).  That
makes acceptance patterns exact and reproducible in tests; the served tokens
come only from verification through the cache.
"""

from __future__ import annotations

import attrs
import numpy as np

from hkv_core.errors import InvalidArgument
from hkv_exec_ref.tiny_v4.numerics import I64

MAX_DRAFT_TOKENS = 16  # longer drafts gain nothing at any realistic acceptance rate


def _k(spec: DraftSpec, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 1 <= value <= MAX_DRAFT_TOKENS:
        raise InvalidArgument(action="DraftSpec", argument="k", value=value,
                              reason=f"must be an integer in [1, {MAX_DRAFT_TOKENS}]")


def _probability(spec: DraftSpec, attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
        raise InvalidArgument(action="DraftSpec", argument="accept_probability", value=value,
                              reason="must be a number in [0, 1]")


def _seed(spec: DraftSpec, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise InvalidArgument(action="DraftSpec", argument="seed", value=value, reason="must be an integer >= 0")


@attrs.frozen(kw_only=True)
class DraftSpec:
    """How `Engine.generate` speculates: `k` draft tokens per step, each right with `accept_probability`
    (seeded by `seed`).  InvalidArgument for a k outside [1, 16], a probability outside [0, 1] or a negative
    seed."""

    k: int = attrs.field(validator=_k)
    accept_probability: float = attrs.field(default=0.6, validator=_probability)
    seed: int = attrs.field(default=0, validator=_seed)


class Proposer:
    """Draft tokens for one request: the target's greedy continuation `truth`, each token kept with
    probability p and otherwise replaced by a different id (seeded per request)."""

    def __init__(self, spec: DraftSpec, truth: I64, vocab: int, request: int) -> None:
        self.spec, self.truth, self.vocab = spec, truth, vocab
        self.rng = np.random.default_rng((spec.seed, request))

    def propose(self, generated: int, k: int) -> I64:
        """k drafts following the first `generated` tokens of the continuation."""
        right = self.truth[generated:generated + k]
        assert len(right) == k, (generated, k, len(self.truth))
        keep = self.rng.random(k) < self.spec.accept_probability
        wrong = (right + 1 + self.rng.integers(0, self.vocab - 1, size=k)) % self.vocab
        return np.where(keep, right, wrong).astype(np.int64)


def accepted_count(drafts: I64, choices: I64) -> int:
    """Greedy acceptance: how many leading drafts equal the target's choices (choices[i] follows drafts[:i])."""
    same = drafts == choices[:len(drafts)]
    return int(len(drafts) if same.all() else np.argmin(same))
