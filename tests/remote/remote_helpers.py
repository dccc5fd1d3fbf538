"""Prompts and engines of the remote tier's tests."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from hkv_exec_ref import Engine
from hkv_tiers.mooncake_master import MooncakeMaster
from hkv_tiers.remote_store import RemoteStore

KEY_SEED = 7
FAST = {"deadline_s": 0.3, "retry_s": 0.2}  # fault tests: a late answer is a miss soon, a retry comes soon


def prompt(seed: int, tokens: int = 200) -> np.ndarray:
    """A prompt no other test uses (its own seed), in tiny V4's vocabulary of 64."""
    return np.random.default_rng(seed).integers(0, 64, tokens)


def longer(head: np.ndarray, seed: int, tokens: int = 24) -> np.ndarray:
    """`head` and then tokens of its own: a request that shares `head` as its prefix."""
    return np.concatenate([head, prompt(seed, tokens)])


def engine(master: MooncakeMaster, *, faults: Any = None, **options: Any) -> Engine:
    """An instance of tiny V4 (seed 0, the shared key seed) on `master`; loads whatever the tiers hold."""
    remote = master.config(**{**FAST, **({"faults": faults} if faults is not None else {}),
                              **options.pop("remote", {})})
    return Engine.tiny(0, key_seed=KEY_SEED, remote=remote, load_policy="load", **options)


def store(e: Engine) -> RemoteStore:
    assert e.tiers is not None and e.tiers.cache.remote is not None
    return e.tiers.cache.remote


def published(e: Engine) -> int:
    """Records the instance has put into the store (after waiting for those on their way)."""
    assert store(e).drain(timeout_s=10) == 0
    return store(e).counts["published"]


def threads() -> set[threading.Thread]:
    """hkv's worker threads alive now (a test's own must be gone after it: `threads() <= before`; threads of
    other tests' engines may end meanwhile, when those are collected)."""
    return {t for t in threading.enumerate() if t.name.startswith(("hkv-remote", "hkv-load", "hkv-write"))}
