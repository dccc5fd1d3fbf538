"""hkv's driver for the peer benchmark harness (`bench_peers.py`, outside this repository), kept in the project.

The harness uses this class instead of its built-in one when it runs from the
project root (it injects `BS`, `np` and `now`).  Same workload and phases as
the built-in driver; what differs is the API: an allocation that must copy
(the working compressor tail seeded from the hit's snapshot) returns a plan,
which an engine hands to its executor and completes; there is no executor
here (the peers move no bytes either), so the plan is completed at once.
Token lists go to add_request as they are (it converts them itself).
"""

from __future__ import annotations

import time
from typing import Any

import numpy

from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig
from hkv_core.plan import Completion

# The harness sets these on the module before running it; the defaults are its values.
BS: int = globals().get("BS", 16)
np: Any = globals().get("np", numpy)
now: Any = globals().get("now", time.perf_counter)
DONE = Completion()
HKV_SUBPHASES = ("convert", "add_request", "match", "acquire", "allocate", "commit", "release")


class HkvEngine:
    """hkv CacheManager driven like the harness's built-in driver (see the harness for the phases)."""

    PRESETS = {"hkv": "llama_full", "hkv-v4": "deepseek_v4_flash"}

    def __init__(self, pool_blocks: int, max_model_len: int, kind: str = "hkv") -> None:
        self.name, self.preset = kind, self.PRESETS[kind]
        layout = Layout.from_preset(self.preset, block_tokens=BS)
        self.m = CacheManager(layout, ManagerConfig(default_pool_pages=pool_blocks, key_seed=1,
                                                    max_request_tokens=max(max_model_len, 1 << 21)))
        self.sub = dict.fromkeys(HKV_SUBPHASES, 0.0)
        self.stats = self.m.core.stats
        self.n_pools = len(layout.pools)

    def coordinator_name(self) -> str:
        return f"CacheManager({self.preset}, {self.n_pools} pools)"

    def _allocate(self, rid: int, count: int) -> None:
        plan = self.m.allocate(rid, count).plan
        if plan is not None:
            self.m.complete(plan.plan_id, DONE)

    def run_request(self, tokens: list[int], times: list[float]) -> int:
        m, sub = self.m, self.sub
        t0 = now()
        rid = m.add_request(tokens)  # converts the list and hashes the prompt
        t1 = now()
        hit = m.match(rid)
        tb = now()
        m.acquire(rid, hit)
        t2 = now()
        todo = len(tokens) - hit.tokens
        self._allocate(rid, todo)
        tc = now()
        m.commit(rid, todo)
        t3 = now()
        m.release(rid)
        t4 = now()
        times[0] += t1 - t0
        times[1] += t2 - t1
        times[2] += t3 - t2
        times[3] += t4 - t3
        sub["add_request"] += t1 - t0
        sub["match"] += tb - t1
        sub["acquire"] += t2 - tb
        sub["allocate"] += tc - t2
        sub["commit"] += t3 - tc
        sub["release"] += t4 - t3
        return hit.tokens

    def w2(self, tokens: list[int]) -> dict[str, float]:
        m, r, n = self.m, {}, len(tokens)

        def timed(key: str, call: Any) -> Any:
            t0 = now()
            out = call()
            r[key] = now() - t0
            return out

        arr = timed("convert_s", lambda: np.asarray(tokens))
        timed("hash_only_s", lambda: m.core.hasher.hash_blocks(arr))
        rid = timed("hash_s", lambda: m.add_request(arr))
        hit = timed("miss_lookup_s", lambda: _matched(m, rid))
        timed("alloc_only_s", lambda: self._allocate(rid, n - hit.tokens))
        timed("commit_s", lambda: m.commit(rid, n - hit.tokens))
        r["alloc_s"] = r["alloc_only_s"] + r["commit_s"]
        timed("release_s", lambda: m.release(rid))
        arr2 = timed("convert2_s", lambda: np.asarray(tokens))
        rid2 = timed("hash2_s", lambda: m.add_request(arr2))
        hit = timed("hit_lookup_s", lambda: m.match(rid2))
        r["hit_tokens"] = hit.tokens
        timed("hit_acquire_s", lambda: m.acquire(rid2, hit))
        timed("hit_alloc_commit_s", lambda: (self._allocate(rid2, n - hit.tokens), m.commit(rid2, n - hit.tokens)))
        r["hit_alloc_s"] = r["hit_acquire_s"] + r["hit_alloc_commit_s"]
        timed("release2_s", lambda: m.release(rid2))
        return r


def _matched(m: CacheManager, rid: int) -> Any:
    """Match and acquire (a miss's lookup)."""
    hit = m.match(rid)
    m.acquire(rid, hit)
    return hit
