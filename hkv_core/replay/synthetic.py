"""A second synthetic trace, built unlike the Mooncake one: multi-turn sessions with long gaps, many one-shots.

Every prompt starts with one of a few shared system prompts (Zipf-like
popularity).  A session's turn `k + 1` sends turn `k`'s whole prompt, its
output and a new user message, after a long pause (exponential, mean
`turn_gap_s`); one-shot requests send a system prompt and one long document
never seen again.  Output lengths are drawn from one distribution for both
kinds, so they say nothing about reuse here.  Block ids are prefix-chained
as in the Mooncake format (`hkv_core/replay/trace.py`): a full block keeps
its id in every later turn; a prompt's partial last block gets an id of its
own (the next turn's block at that position holds more tokens).
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import numpy as np

from hkv_core.replay.trace import TraceRequest

__all__ = ["FreshIds", "SessionTraceConfig", "session_trace", "write_trace"]


@attrs.frozen(kw_only=True)
class SessionTraceConfig:
    """The shape of a session trace; the defaults give about 4,000 requests over 1,000 s."""

    block_tokens: int = 512
    sessions: int = 450
    mean_turns: float = 4.5
    one_shots: int = 2000
    duration_s: float = 1000.0
    turn_gap_s: float = 150.0
    system_prompts: int = 8
    system_blocks: tuple[int, int] = (2, 12)  # a system prompt's length in blocks, low and high
    message_tokens: tuple[int, int] = (200, 4000)  # a user message's tokens, low and high
    document_tokens: tuple[int, int] = (2000, 40000)  # a one-shot's document tokens, low and high
    mean_output_tokens: float = 250.0


class FreshIds:
    """Fresh block (hash) ids, one counter for a whole trace: every new block gets the next integer."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, count: int) -> list[int]:
        out = list(range(self.next, self.next + count))
        self.next += count
        return out


def _request(stamp_s: float, chain: list[int], tokens: int, output: int, ids: FreshIds,
             block: int) -> TraceRequest:
    """A request whose prompt is the first `tokens` tokens of `chain` (grown with fresh ids as needed)."""
    full = tokens // block
    if full > len(chain):
        chain.extend(ids.take(full - len(chain)))
    hash_ids = chain[:full] + (ids.take(1) if tokens % block else [])
    return TraceRequest(timestamp=round(stamp_s * 1000), input_length=tokens, output_length=output,
                        hash_ids=tuple(hash_ids))


def session_trace(config: SessionTraceConfig, seed: int = 0) -> list[TraceRequest]:
    """The requests of one trace of `config`'s shape, in timestamp order (equal seeds give equal traces)."""
    rng, ids, block = np.random.default_rng(seed), FreshIds(), config.block_tokens
    weights = 1.0 / np.arange(1, config.system_prompts + 1)
    systems = [ids.take(int(rng.integers(*config.system_blocks, endpoint=True))) for _ in weights]

    def system() -> list[int]:
        return list(systems[int(rng.choice(len(systems), p=weights / weights.sum()))])

    def output() -> int:
        return max(1, int(rng.exponential(config.mean_output_tokens)))

    out = []
    for _ in range(config.sessions):
        chain, stamp = system(), float(rng.uniform(0, config.duration_s * 0.8))
        tokens = len(chain) * block
        for _ in range(1 + int(rng.poisson(config.mean_turns - 1))):
            tokens += int(rng.integers(*config.message_tokens, endpoint=True))
            answer = output()
            out.append(_request(stamp, chain, tokens, answer, ids, block))
            tokens += answer
            stamp += float(rng.exponential(config.turn_gap_s))
    for _ in range(config.one_shots):
        chain = system()
        tokens = len(chain) * block + int(rng.integers(*config.document_tokens, endpoint=True))
        out.append(_request(float(rng.uniform(0, config.duration_s)), chain, tokens, output(), ids, block))
    return sorted(out, key=lambda r: r.timestamp)


def write_trace(requests: list[TraceRequest], path: str | Path) -> None:
    """Write `requests` as Mooncake-format JSON lines."""
    lines = (json.dumps({"timestamp": r.timestamp, "input_length": r.input_length,
                         "output_length": r.output_length, "hash_ids": list(r.hash_ids)}) for r in requests)
    Path(path).write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
