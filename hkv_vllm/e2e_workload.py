"""The end-to-end check's workload: users' multi-turn chats sharing a system prompt, as a Mooncake trace.

Turn k's prompt of a user is turn k-1's prompt, the answer the engine gave to it, and a new user
message: later turns extend earlier ones, as a chat does.  With `branch`, every other user's last
turn instead rewrites turn k-1's message: its prompt leaves the cached chat where turn k-1's
prompt was the shared system prompt and the first message, a junction inside a cached chain.

The system prompt and the user messages are a function of the seed; the answers are the engine's, so
the prompts of turn k are known only once turn k-1 is served (`next_prompts`). Token ids are the
tiny model's words (4 .. 511).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from hkv_vllm.tiny_model import SPECIALS, VOCAB


@dataclass(frozen=True)
class Workload:
    users: int = 6
    turns: int = 4
    system_tokens: int = 96
    message_tokens: int = 40
    answer_tokens: int = 40
    seed: int = 0
    sliding_window: int = 0  # > 0: the model's first layer attends to a window of this many tokens (a hybrid)
    fine_hits: bool = False  # hkv's engine resumes inside vLLM's blocks (additional_config hkv.fine_hits)
    model: str = "tiny-llama"  # or "tiny-qwen3-next": a Gated DeltaNet / full-attention hybrid (vLLM's Mamba group)
    branch: bool = False  # every other user's last turn branches off the chat (a junction): `next_prompts`

    @classmethod
    def quick(cls) -> Workload:
        return cls(users=3, turns=3, system_tokens=64, message_tokens=32, answer_tokens=24)

    @classmethod
    def qwen3_next(cls, quick: bool = False) -> Workload:
        """Sized for the tiny Qwen3-Next's 96-token blocks: a system prompt of several blocks, a branching turn."""
        if quick:
            return cls(users=3, turns=3, system_tokens=224, message_tokens=64, answer_tokens=64,
                       model="tiny-qwen3-next", branch=True)
        return cls(users=4, turns=4, system_tokens=224, message_tokens=64, answer_tokens=96,
                   model="tiny-qwen3-next", branch=True)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(len(SPECIALS), VOCAB) for _ in range(n)]


def messages(w: Workload) -> tuple[list[int], list[list[list[int]]]]:
    """The system prompt and, per user and turn, the user's message."""
    rng = random.Random(w.seed)
    system = _tokens(rng, w.system_tokens)
    return system, [[_tokens(rng, w.message_tokens) for _ in range(w.turns)] for _ in range(w.users)]


def next_prompts(w: Workload, turn: int, last: list[list[int]], answers: list[list[int]]) -> list[list[int]]:
    """Every user's prompt of `turn` (0-based), given the previous turn's prompts and answers."""
    system, msgs = messages(w)
    if turn == 0:
        return [system + msgs[u][0] for u in range(w.users)]
    branching = w.branch and turn == w.turns - 1
    return [_branch(w, last[u], answers[u], msgs[u][turn]) if branching and u % 2
            else last[u] + answers[u] + msgs[u][turn] for u in range(w.users)]


def _branch(w: Workload, last: list[int], answer: list[int], message: list[int]) -> list[int]:
    """A branching turn: the previous prompt less its last message, then this turn's message (it rewrites the
    previous message, so the prompt leaves the cached chat inside the previous prompt)."""
    del answer
    return last[:len(last) - w.message_tokens] + message


def trace_records(prompts: list[list[int]], outputs: list[int], times_ms: list[int],
                  block: int) -> list[dict[str, object]]:
    """Mooncake trace records (timestamp, input_length, output_length, hash_ids) of the served requests:
    one hash id per `block` prompt tokens, equal ids for equal prefixes (chained)."""
    ids: dict[tuple[int, ...], int] = {}
    records = []
    for prompt, out, ts in zip(prompts, outputs, times_ms, strict=True):
        hashes = [ids.setdefault(tuple(prompt[:end]), len(ids)) for end in range(block, len(prompt) + block, block)]
        records.append({"timestamp": ts, "input_length": len(prompt), "output_length": out, "hash_ids": hashes})
    return records


def write_trace(records: list[dict[str, object]], path: Path) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
