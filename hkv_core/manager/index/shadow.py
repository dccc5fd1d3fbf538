"""Miniature simulations (Waldspurger et al., USENIX ATC 2017): the adaptive policy's setting chosen online.

One small shadow cache per candidate setting, each fed the same hash-sampled
subset of the keys the policy is shown (a key is sampled when its hash's
upper bits fall in one residue class of `SAMPLE_MODULUS`), each holding the
cache's capacity divided by the modulus, each evicting by its own setting's
priorities (computed by the policy at the touch, with the same clock and
capacity as the real cache: a uniform sample of the keys scales the
capacity, not the time).  A shadow counts a hit when a sampled key is
touched while it holds it; the setting whose shadow hit most so far is the
one the real cache uses (ties: the earlier candidate).  The shadows see what
the policy sees at the touch and nothing else.
"""

from __future__ import annotations

import heapq

import numpy as np
from numpy.typing import NDArray

SAMPLE_MODULUS = 16  # sampling rate 1/16: a key is sampled when (its hash's upper half) % 16 == 0
SAMPLE_SHIFT = np.uint64(32)  # sample on the upper half (the lower bits place a key in the key table)
COMPACT_FACTOR = 4  # a shadow's heap is rebuilt when it holds this many entries per block it may keep

Entry = tuple[float, int, int]  # (priority, access number, key): a shadow's heap entry


class Shadows:
    """Shadow caches, one per candidate, over the sampled keys (see the module docstring)."""

    def __init__(self, candidates: int, capacity_blocks: int, modulus: int = SAMPLE_MODULUS) -> None:
        self.modulus = np.uint64(modulus)
        self.capacity = max(1, capacity_blocks // modulus)
        self.held: list[dict[int, tuple[float, int]]] = [{} for _ in range(candidates)]  # key -> (priority, access)
        self.heaps: list[list[Entry]] = [[] for _ in range(candidates)]  # lazy: an entry not in `held` is stale
        self.hits = [0] * candidates
        self.accesses = 0

    def sampled(self, keys: NDArray[np.uint64]) -> NDArray[np.bool_]:
        """Which of `keys` (64-bit key hashes) the shadows see."""
        return np.asarray((keys >> SAMPLE_SHIFT) % self.modulus == 0)

    def access(self, keys: list[int], priorities: NDArray[np.float64]) -> None:
        """Sampled keys of one touched chain, in touch order, and each candidate's priority for them
        (candidates x keys): first every key the shadow holds is a hit (as the real cache matches a whole
        prefix before it allocates), then each key is (re)inserted at `max(its priority, the one it had)` and
        the lowest priorities leave until the shadow fits."""
        first = self.accesses
        self.accesses += len(keys)
        for k, held in enumerate(self.held):
            had = [held.get(key) for key in keys]
            self.hits[k] += sum(h is not None for h in had)
            heap = self.heaps[k]
            for j, key in enumerate(keys):
                before = had[j]
                priority = float(priorities[k, j]) if before is None else max(float(priorities[k, j]), before[0])
                held[key] = (priority, first + j)
                heapq.heappush(heap, (priority, first + j, key))
                while len(held) > self.capacity:
                    _, number, victim = heapq.heappop(heap)
                    if held.get(victim, (0.0, -1))[1] == number:
                        del held[victim]
            if len(heap) > COMPACT_FACTOR * self.capacity + len(keys):
                self.heaps[k] = [e for e in heap if held.get(e[2], (0.0, -1))[1] == e[1]]
                heapq.heapify(self.heaps[k])

    def best(self) -> int:
        """The candidate whose shadow hit most (the earliest of equals)."""
        return self.hits.index(max(self.hits))

    def clone(self) -> Shadows:
        twin = Shadows.__new__(Shadows)
        twin.modulus, twin.capacity, twin.accesses = self.modulus, self.capacity, self.accesses
        twin.held = [dict(h) for h in self.held]
        twin.heaps = [list(h) for h in self.heaps]
        twin.hits = list(self.hits)
        return twin
