"""The promise through the tiers, as a property: any interleaving of requests over shared prefixes,
evictions of any tier, clean restarts and crashes, at any small device and host size, serves every
response bit-identical to recomputation - and a reopened engine never serves another run's bytes."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hkv_exec_ref.engine import Engine

ROOTS = [np.random.default_rng(seed).integers(0, 64, 40) for seed in range(3)]  # three shared heads

prompts = st.tuples(st.integers(0, 2), st.integers(9, 40), st.lists(st.integers(0, 63), max_size=10))
steps = st.one_of(
    st.tuples(st.just("serve"), prompts),
    st.tuples(st.just("evict"), st.sampled_from(["device", "host", "disk"])),
    st.tuples(st.just("restart"), st.booleans()),  # True: a clean close; False: a crash (nothing flushed)
)


def prompt_of(root: int, head: int, tail: list[int]) -> np.ndarray:
    return np.concatenate([ROOTS[root][:head], np.array(tail, np.int64)])


@settings(max_examples=max(12, settings.default.max_examples // 20), deadline=None)  # deep profile: 250
@given(st.lists(steps, min_size=4, max_size=14), st.sampled_from([16, 24, 48]), st.sampled_from([0, 4, 16]),
       st.sampled_from(["load", "cost"]))
def test_every_response_through_the_tiers_equals_recomputation(script: list[tuple[str, object]], pages: int,
                                                              host_records: int, policy: str) -> None:
    directory = Path(tempfile.mkdtemp(prefix="hkv-tier-oracle-"))

    def open_engine() -> Engine:
        return Engine.tiny(0, disk_dir=directory, host_bytes=host_records * 8192, default_pool_pages=pages,
                           load_policy=policy)

    engine = open_engine()
    try:
        for action, arg in script:
            if action == "serve":
                root, head, tail = arg  # type: ignore[misc]
                prompt = prompt_of(root, head, tail)
                served = engine.generate(prompt, 3)
                assert engine.matches_recompute(prompt, served), (prompt.tolist(), served.cached_by_tier)
                assert sum(served.cached_by_tier.values()) == served.cached_tokens
            elif action == "evict":
                engine.evict(str(arg))
            else:
                if arg:
                    engine.close()
                else:
                    assert engine.tiers is not None
                    engine.tiers.cache.abandon()
                engine = open_engine()
    finally:
        if engine.tiers is not None:
            engine.tiers.cache.abandon()
        shutil.rmtree(directory, ignore_errors=True)
