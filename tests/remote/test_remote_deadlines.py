"""A lookup or get past its deadline against a client stuck in a call (a master that does not answer): the
serving thread goes on, and what timed out while still queued behind the stuck call never runs."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from hkv_core import Layout
from hkv_exec_ref.tiers import RemoteStore, RemoteTierConfig
from hkv_exec_ref.tiers.record_check import Wanted, span_abi_id
from hkv_exec_ref.tiers.span_io import BLOCK

LAYOUT = Layout.from_preset("tiny_v4")


class StuckClient:
    """A Mooncake client whose calls wait until `go` is set (a master that stopped answering)."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.calls: list[str] = []

    def register_buffer(self, base: int, nbytes: int) -> int:
        return 0

    def unregister_buffer(self, base: int) -> int:
        return 0

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        self.calls.append("lookup")
        self.go.wait()
        return [0] * len(keys)

    def batch_get_into(self, keys: list[str], addresses: list[int], sizes: list[int]) -> list[int]:
        self.calls.append("get")
        self.go.wait()
        return [-704] * len(keys)

    def close(self) -> None:
        pass


def test_calls_past_their_deadline_behind_a_stuck_one_never_run_and_free_their_slots() -> None:
    client = StuckClient()
    config = RemoteTierConfig(master="127.0.0.1:1", metadata="http://127.0.0.1:2/m", workers=1, deadline_s=0.1,
                              retry_s=0.01)
    remote: Any = RemoteStore(config, fingerprint=LAYOUT.fingerprint(), abi_id=span_abi_id(LAYOUT.pools),
                              model_id="stuck", client=client)
    try:
        for _ in range(5):  # the first is stuck in the client; the others wait behind it and time out
            began = time.monotonic()
            assert remote.locate(["a", "b"]) == set() and time.monotonic() - began < 1
            time.sleep(0.02)  # past retry_s
        got = remote.fetch([Wanted(BLOCK, np.array([1, 2], np.uint64), 0, 8, 256)])
        assert got == [None] and remote.counts["get_timeout"] == 1
        assert remote.staging.used_bytes == 0  # the get never ran: its slot is back at once
    finally:
        client.go.set()
        remote.close()
    assert client.calls == ["lookup"]  # the late lookups and the get were cancelled, not run after it
