"""A lookup or get past its deadline against a client stuck in a call (a master that does not answer): the
serving thread goes on, and what timed out while still queued behind the stuck call never runs."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from hkv_core import Layout
from hkv_core.tiers.record import UNSUMMED, RecordHeader
from hkv_tiers import RemoteStore, RemoteTierConfig
from hkv_tiers.record_check import Wanted, span_abi_id
from hkv_tiers.span_io import BLOCK

LAYOUT = Layout.from_preset("tiny_v4")
ABI = span_abi_id(LAYOUT.pools)


def header(n: int, payload_bytes: int) -> RecordHeader:
    return RecordHeader(layout_fingerprint=LAYOUT.fingerprint(), kind=BLOCK, abi_id=ABI, token_start=8 * n,
                        token_end=8 * n + 8, keys=np.array([[n, 3]], np.uint64), payload_bytes=payload_bytes,
                        payload_checksum=UNSUMMED)


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

    def put_from(self, key: str, address: int, nbytes: int) -> int:
        self.calls.append("put")
        self.go.wait()
        return 0

    def close(self) -> None:
        pass


def test_calls_past_their_deadline_behind_a_stuck_one_never_run_and_free_their_slots() -> None:
    client = StuckClient()
    config = RemoteTierConfig(master="127.0.0.1:1", metadata="http://127.0.0.1:2/m", workers=1, deadline_s=0.1,
                              retry_s=0.01)
    remote: Any = RemoteStore(config, fingerprint=LAYOUT.fingerprint(), abi_id=ABI,
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


def test_puts_stuck_past_the_deadline_stall_one_publish_not_every_one() -> None:
    client = StuckClient()
    config = RemoteTierConfig(master="127.0.0.1:1", metadata="http://127.0.0.1:2/m", workers=1, deadline_s=0.2,
                              retry_s=30.0, staging_bytes=64 << 10)  # 8 slots of one small record each
    remote: Any = RemoteStore(config, fingerprint=LAYOUT.fingerprint(), abi_id=ABI, model_id="stuck", client=client)
    payload = np.zeros(256, np.uint8)
    try:
        for n in range(8):  # one put stuck in the client, seven waiting behind it: the arena is full
            remote.publish(f"r{n}", header(n, 256), payload)
        began = time.monotonic()
        for n in range(8, 28):
            remote.publish(f"r{n}", header(n, 256), payload)
        assert time.monotonic() - began < 1.0  # one deadline waited for room, not one per record (4 s)
        assert remote.counts["publish_skipped_full"] == 1 and remote.counts["publish_skipped"] == 19
        assert remote.counts["unavailable"] == 1 and not remote.available
    finally:
        client.go.set()
        remote.close()
