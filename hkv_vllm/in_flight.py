"""Prompt blocks being computed in the steps in flight, so a request that shares them waits for them.

hkv publishes a block once vLLM reports it computed (docs/vllm.md,
visibility), where vLLM publishes it when it is scheduled and lets a second
request of the same step resume from KV the first one writes in that very
step.  Without more, a request that arrives while another computes the
prefix they share would compute that prefix again.  hkv's scheduler instead
leaves such a request waiting for a step (vLLM's own "skip this request for
this step", as for a grammar still compiling): the step after, the blocks
are published and it resumes from them.  It waits only while a block past
its current hit is being computed, so it never waits for nothing, and never
longer than the other request computes the prefix they share.

`PrefillsInFlight` keeps vLLM's block hashes of the prompt blocks each step
schedules, for the steps whose KV is not yet written: one under vLLM's
scheduler, two under its async scheduler (step n+1 is scheduled before step
n is reported).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any


class PrefillsInFlight:
    """vLLM block hashes of prompt blocks scheduled in the last `steps` steps (`hash_block_tokens` a block);
    hits land on multiples of `hit_step_tokens`."""

    def __init__(self, hash_block_tokens: int, hit_step_tokens: int, *, steps: int = 1) -> None:
        if hash_block_tokens <= 0 or hit_step_tokens <= 0 or steps <= 0:
            raise ValueError("hash_block_tokens, hit_step_tokens and steps must be positive, got "
                             f"{hash_block_tokens}, {hit_step_tokens}, {steps}")
        self.hash_block_tokens, self.hit_step_tokens = hash_block_tokens, hit_step_tokens
        self._steps: deque[set[Any]] = deque([set()], maxlen=steps)
        self.holding = False  # a request waits in this step: the requests after it wait too (first come first)

    @property
    def steps(self) -> int:
        return self._steps.maxlen or 1

    @steps.setter
    def steps(self, steps: int) -> None:
        if steps <= 0:
            raise ValueError(f"steps must be positive, got {steps}")
        self._steps = deque(self._steps, maxlen=steps)

    def next_step(self) -> None:
        """A new step is being scheduled: the oldest step's blocks are written by now."""
        self.holding = False
        if len(self._steps) == self._steps.maxlen and not any(self._steps):
            return  # nothing in flight (the common case: decode only)
        self._steps.append(set())

    def record(self, hashes: Sequence[Any], start_token: int, end_token: int, prompt_tokens: int) -> None:
        """The step computes tokens [start_token, end_token) of a request whose block hashes are `hashes`: its
        prompt blocks that complete in them are in flight."""
        end_token = min(end_token, prompt_tokens)
        first, last = start_token // self.hash_block_tokens, end_token // self.hash_block_tokens
        if last > first:
            self._steps[-1].update(hashes[first:last])

    def queue_waits(self, hashes: Sequence[Any], num_tokens: int, hit_tokens: Callable[[], int]) -> bool:
        """`waits`, first come first served: once a request of this step waits, every later one does too."""
        if not self.holding:
            self.holding = self.waits(hashes, num_tokens, hit_tokens)
        return self.holding

    def waits(self, hashes: Sequence[Any], num_tokens: int, hit_tokens: Callable[[], int]) -> bool:
        """Whether a request of `num_tokens` tokens with these block hashes would resume further by waiting:
        its blocks in flight reach a hit (a multiple of `hit_step_tokens`, short of its last token) past the hit
        it would take now (`hit_tokens()`, asked only when one of its blocks is in flight)."""
        if all(step.isdisjoint(hashes) for step in self._steps):
            return False
        last = max(i for i, h in enumerate(hashes) if any(h in step for step in self._steps))
        reach = min((last + 1) * self.hash_block_tokens, num_tokens - 1)
        return reach // self.hit_step_tokens * self.hit_step_tokens > hit_tokens()
