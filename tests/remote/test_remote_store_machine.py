"""A state machine over the RemoteStore against a real master: publishes (some damaged), fetches (some asking for
another range than the record holds, some late), releases.

Every record's payload is a function of its name, so whatever happens - a flipped byte, a truncated or
foreign-layout record, a fetch that asks for what the record is not, a get past its deadline - a fetch
returns exactly that payload or nothing; a record found bad is gone from the store; and the staging arena
holds exactly the last fetch's payloads and the records still on their way, nothing else.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from conftest import MISSING
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from hkv_core import Layout
from hkv_core.tiers.record import UNSUMMED, RecordHeader, padded
from hkv_tiers import MooncakeMaster, RemoteFaults, RemoteStore, remote_store
from hkv_tiers.mooncake_client import connect
from hkv_tiers.record_check import Wanted, record_name, span_abi_id
from hkv_tiers.span_io import BLOCK

LAYOUT = Layout.from_preset("tiny_v4")
ABI = span_abi_id(LAYOUT.pools)
DAMAGE = ("flip_byte", "truncate", "foreign_layout")
EXAMPLES = itertools.count()


def payload(n: int) -> bytes:
    """The only bytes record n may ever hold."""
    return np.random.default_rng(n).integers(0, 256, 64 + n * 97 % 6000, np.uint8).tobytes()


def key_of(n: int) -> np.ndarray:
    return np.array([n, 11], np.uint64)


def want(n: int, shift: int = 0) -> Wanted:
    return Wanted(BLOCK, key_of(n), 8 * n + shift, 8 * n + 8 + shift, len(payload(n)))


class RemoteStoreMachine(RuleBasedStateMachine):
    client: Any = None
    master: MooncakeMaster | None = None

    def __init__(self) -> None:
        super().__init__()
        self.faults = RemoteFaults(slow_seconds=0.6)
        config = self.master.config(deadline_s=0.5, retry_s=0.05, staging_bytes=64 << 10,  # type: ignore[union-attr]
                                    faults=self.faults)
        self.store = RemoteStore(config, fingerprint=LAYOUT.fingerprint(), abi_id=ABI,
                                 model_id=f"machine example {next(EXAMPLES)}", client=self.client)
        self.next = 0
        self.good: set[int] = set()  # published intact and never found bad: a fetch returns its payload
        self.sent: set[int] = set()  # published at all

    def teardown(self) -> None:
        self.store.close()

    @rule(damage=st.sampled_from((None, *DAMAGE)))
    def publish(self, damage: str | None) -> None:
        n, self.next = self.next, self.next + 1
        data = payload(n)
        if damage:
            setattr(self.faults, damage, 1)
        header = RecordHeader(layout_fingerprint=LAYOUT.fingerprint(), kind=BLOCK, abi_id=ABI, token_start=8 * n,
                              token_end=8 * n + 8, keys=key_of(n).reshape(1, 2), payload_bytes=len(data),
                              payload_checksum=UNSUMMED)
        before = self.store.counts["published"]
        self.store.publish(record_name(key_of(n)), header, data)
        assert self.store.drain(timeout_s=10) == 0
        for name in DAMAGE:  # armed for this record only
            setattr(self.faults, name, 0)
        self.sent.add(n)
        if not damage and self.store.counts["published"] == before + 1:
            self.good.add(n)

    @precondition(lambda self: self.sent)
    @rule(data=st.data(), shifted=st.booleans(), slow=st.sampled_from((False, False, False, True)))
    def fetch(self, data: st.DataObject, shifted: bool, slow: bool) -> None:
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.sent)), min_size=1, max_size=4, unique=True))
        wanted = [want(n, 8 if shifted and i == 0 else 0) for i, n in enumerate(chosen)]
        self.faults.slow_get = int(slow)
        late, down = self.store.counts["get_timeout"], self.store.counts["unavailable"]
        got = self.store.fetch(wanted)
        late = self.store.counts["get_timeout"] > late
        self.faults.slow_get = 0  # armed for this fetch only (one that asks the store nothing does not use it)
        for i, (n, result) in enumerate(zip(chosen, got, strict=True)):
            mismatched = shifted and i == 0
            if result is not None:
                assert not (late or mismatched), "a late or mismatched record was served"
                assert n in self.good and bytes(result[1]) == payload(n), f"record {n} served with other bytes"
            elif n in self.good and not late:
                assert mismatched, f"record {n}, published intact, was not served"
                self.good.discard(n)  # asked for as another range: found bad, dropped from the store
        if late:
            assert slow and self.store.counts["unavailable"] == down + 1, "only the slowed get is late"
            wait(lambda: self.store.staging.used_bytes == self._held_bytes())  # the late get gives its slots back
            self.store.down_until = 0.0  # the machine does not wait out retry_s

    @rule()
    def release(self) -> None:
        self.store.release()
        assert not self.store.held

    @invariant()
    def staging_holds_only_the_last_fetchs_payloads(self) -> None:
        assert self.store.staging.used_bytes == self._held_bytes()

    def _held_bytes(self) -> int:
        return sum(padded(self.store.staging.records[slot][1]) for slot in self.store.held)


def wait(done: Any, seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < end, "the late get never gave its staging slots back"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def shared_client() -> Iterator[tuple[MooncakeMaster, Any]]:
    if MISSING:
        pytest.skip(MISSING)
    with MooncakeMaster() as master:
        client = connect(master.config())
        try:
            yield master, client
        finally:
            client.close()


# a fifth of the profile's examples (ci: 40, deep: 1,000): each one talks to a real master
MACHINE = settings(max_examples=max(10, settings.default.max_examples // 5), stateful_step_count=12, deadline=None)


def test_a_fetch_returns_the_published_bytes_or_nothing(shared_client: tuple[MooncakeMaster, Any]) -> None:
    RemoteStoreMachine.master, RemoteStoreMachine.client = shared_client
    run_state_machine_as_test(RemoteStoreMachine, settings=MACHINE)


def test_the_machine_catches_a_store_that_serves_unchecked_records(shared_client: tuple[MooncakeMaster, Any],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_store, "check_record", lambda *args, **kwargs: None)
    RemoteStoreMachine.master, RemoteStoreMachine.client = shared_client
    with pytest.raises(AssertionError, match="served"):
        run_state_machine_as_test(RemoteStoreMachine, settings=settings(MACHINE, report_multiple_bugs=False))
