"""A multi-turn workload for the tier tests: sessions whose turns extend each other, interleaved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hkv_exec_ref.engine import Engine, ServeResult

SMALL: dict[str, Any] = {"default_pool_pages": 16, "host_bytes": 96 * 1024, "load_policy": "load"}


def tiny(directory: Path, **options: Any) -> Engine:
    """A tiny V4 engine whose device and host hold a few requests' blocks: blocks keep moving to disk."""
    return Engine.tiny(0, disk_dir=directory, **{**SMALL, **options})


class Sessions:
    """`sessions` chats sharing a system prompt; each turn's prompt is the last prompt, its output and new
    user tokens."""

    def __init__(self, sessions: int = 6, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        system = self.rng.integers(0, 64, 19)
        self.prompts = [np.concatenate([system, self.rng.integers(0, 64, 9)]) for _ in range(sessions)]

    def round(self, engine: Engine, new_tokens: int = 4) -> list[tuple[np.ndarray, ServeResult]]:
        """One turn of every session; every result checked against recomputation."""
        served = []
        for i, prompt in enumerate(self.prompts):
            result = engine.generate(prompt, new_tokens)
            assert engine.matches_recompute(prompt, result), f"session {i}: served output differs"
            served.append((prompt, result))
            self.prompts[i] = np.concatenate([prompt, result.tokens, self.rng.integers(0, 64, 5)])
        return served


def pages_leaked(engine: Engine) -> dict[str, int]:
    """Per pool, pages not free once every request ended and the device cache is emptied."""
    engine.manager.clear_cache()
    return {b.name: b.pages - 1 - engine.manager.free_pages(b.name) for b in engine.manager.bindings()
            if b.pages - 1 != engine.manager.free_pages(b.name)}
