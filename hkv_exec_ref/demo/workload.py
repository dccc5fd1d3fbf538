"""The demo's built-in workload, in the Mooncake trace format.

One JSON object per request: `timestamp` (ms), `input_length`, `output_length` and
`hash_ids`, where each hash id names one block of `block_tokens` prompt tokens and
ids are prefix-chained: two requests share hash id k at position i only if they
share every block before it (the last block of a prompt may be partly used).
Two extra fields say where a request comes from: `session` and `kind`.

Sessions (seeded, deterministic):

- chat: a multi-turn conversation on one of a few shared system prompts; each
  turn's input is the previous turn's input plus the assistant's reply and a
  new user message;
- agent: a tool-using session on the shared agent system prompt (tool list);
  each step appends a tool result to the whole history.

Sessions start at random times and their turns arrive after a think time; the
trace is every turn of every session, by timestamp, cut to `requests`.
Tokens of a block are a seeded function of its hash id (`block_tokens_of`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from hkv_core.errors import InvalidArgument
from hkv_core.replay.synthetic import FreshIds
from hkv_exec_ref.tiny_v4.numerics import I64

SESSION_KINDS = ("chat", "agent")
# The demo's bounds.  A request costs about 0.06 s on one core (served through the cache, then recomputed
# to check it; contexts stop at max_input_blocks, so the cost does not grow with the trace) and a few hundred
# bytes of report: 5,000 requests take about 5 minutes.  Seeds are the block keys' seed range, [0, 2**64).
MAX_REQUESTS = 5_000
MAX_SEED = 2**64 - 1


@attrs.frozen(kw_only=True)
class WorkloadConfig:
    """Sizes of the built-in workload (blocks are `block_tokens` tokens)."""

    requests: int = 64
    seed: int = 0
    block_tokens: int = 8
    vocab: int = 64
    chat_system_prompts: int = 2
    system_blocks: tuple[int, int] = (3, 6)  # shared system prompt length, blocks (inclusive range)
    agent_system_blocks: int = 6
    chat_turns: tuple[int, int] = (2, 5)
    agent_steps: tuple[int, int] = (3, 7)
    message_blocks: tuple[int, int] = (1, 3)  # a user message or tool result
    output_tokens: tuple[int, int] = (2, 8)
    agent_share: float = 0.4  # fraction of sessions that are agents
    max_input_blocks: int = 24  # a session ends before its context exceeds this
    session_gap_ms: float = 400.0  # mean time between session starts
    think_ms: tuple[float, float] = (300.0, 3000.0)

    def __attrs_post_init__(self) -> None:
        for name, value, low, high in (("requests", self.requests, 1, MAX_REQUESTS), ("seed", self.seed, 0, MAX_SEED)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InvalidArgument(action="WorkloadConfig", argument=name, value=value,
                                      reason=f"must be an int in [{low}, {high}]")
        assert self.block_tokens >= 1 and self.vocab >= 2, self
        assert 0.0 <= self.agent_share <= 1.0 and self.chat_system_prompts >= 1, self


@attrs.frozen(kw_only=True)
class TraceRecord:
    """One request of the trace (Mooncake fields plus its session and kind)."""

    timestamp: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    session: int
    kind: str

    def to_json(self) -> str:
        return json.dumps({"timestamp": self.timestamp, "input_length": self.input_length,
                           "output_length": self.output_length, "hash_ids": list(self.hash_ids),
                           "session": self.session, "kind": self.kind})

    @classmethod
    def from_json(cls, line: str) -> TraceRecord:
        doc: dict[str, Any] = json.loads(line)
        return cls(timestamp=int(doc["timestamp"]), input_length=int(doc["input_length"]),
                   output_length=int(doc["output_length"]), hash_ids=tuple(int(h) for h in doc["hash_ids"]),
                   session=int(doc.get("session", -1)), kind=str(doc.get("kind", "")))


def _between(rng: np.random.Generator, bounds: tuple[int, int]) -> int:
    return int(rng.integers(bounds[0], bounds[1] + 1))


def _session(rng: np.random.Generator, cfg: WorkloadConfig, ids: FreshIds, systems: list[list[int]],
             agent_system: list[int], number: int, start_ms: float) -> list[TraceRecord]:
    """Every turn of one session: its context grows by whole blocks, the last one partly used."""
    kind = SESSION_KINDS[int(rng.random() < cfg.agent_share)]
    context = list(agent_system if kind == "agent" else systems[int(rng.integers(len(systems)))])
    turns = _between(rng, cfg.agent_steps if kind == "agent" else cfg.chat_turns)
    out, now = [], start_ms
    for turn in range(turns):
        reply = 1 if turn else 0  # the previous answer, as one block of the history
        context += ids.take(reply + _between(rng, cfg.message_blocks))
        if len(context) > cfg.max_input_blocks:
            break
        unused = int(rng.integers(0, cfg.block_tokens))  # the last block is partly used
        out.append(TraceRecord(timestamp=int(now), input_length=len(context) * cfg.block_tokens - unused,
                               output_length=_between(rng, cfg.output_tokens), hash_ids=tuple(context),
                               session=number, kind=kind))
        now += float(rng.uniform(*cfg.think_ms))
    return out


def generate_trace(cfg: WorkloadConfig) -> list[TraceRecord]:
    """The workload: sessions until `requests` turns exist, then every turn by timestamp, cut."""
    rng = np.random.default_rng(cfg.seed)
    ids = FreshIds()
    systems = [ids.take(_between(rng, cfg.system_blocks)) for _ in range(cfg.chat_system_prompts)]
    agent_system = ids.take(cfg.agent_system_blocks)
    records: list[TraceRecord] = []
    start, number = 0.0, 0
    while len(records) < 2 * cfg.requests:  # later sessions would arrive after the cut anyway
        records += _session(rng, cfg, ids, systems, agent_system, number, start)
        start += float(rng.exponential(cfg.session_gap_ms))
        number += 1
    records.sort(key=lambda r: (r.timestamp, r.session))
    return records[:cfg.requests]


def block_tokens_of(hash_id: int, cfg: WorkloadConfig) -> I64:
    """The tokens of the block named `hash_id` (a seeded function of the id)."""
    rng = np.random.default_rng([cfg.seed, hash_id])
    return rng.integers(0, cfg.vocab, cfg.block_tokens).astype(np.int64)


def prompt_tokens(record: TraceRecord, cfg: WorkloadConfig) -> I64:
    """The prompt of a trace record: its blocks' tokens, cut to `input_length`."""
    assert len(record.hash_ids) * cfg.block_tokens >= record.input_length > 0, record
    tokens = np.concatenate([block_tokens_of(h, cfg) for h in record.hash_ids])
    return tokens[:record.input_length]


def write_trace(records: Iterable[TraceRecord], path: Path) -> None:
    path.write_text("".join(r.to_json() + "\n" for r in records))


def read_trace(path: Path) -> Iterator[TraceRecord]:
    for line in path.read_text().splitlines():
        if line.strip():
            yield TraceRecord.from_json(line)
