"""The remote tier under faults: the master stopped and back, corrupt, truncated and foreign records, late gets.

Under each the oracle holds (every response equals a full recomputation), bad records are never served but
dropped from the store and counted, and nothing leaks: staging slots come back, worker threads stop.
"""

from __future__ import annotations

import time

import pytest
from remote_helpers import engine, longer, prompt, published, store, threads

from hkv_exec_ref import RemoteFaults
from hkv_tiers import remote_store
from hkv_tiers.mooncake_master import MooncakeMaster


def serve_checked(e, tokens, new_tokens: int = 3):  # type: ignore[no-untyped-def]
    served = e.generate(tokens, new_tokens)
    assert e.matches_recompute(tokens, served), "served output differs from recomputation"
    return served


def eventually(check, seconds: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < end, "not within the time allowed"
        time.sleep(0.05)


@pytest.mark.parametrize("fault, reason", [("flip_byte", "payload checksum mismatch"), ("truncate", "truncated"),
                                           ("foreign_layout", "a record of another layout")])
def test_a_bad_record_is_dropped_counted_and_never_served(master: MooncakeMaster, fault: str, reason: str) -> None:
    before = threads()
    writer, reader = engine(master, faults=RemoteFaults(**{fault: 1_000})), engine(master)
    head = prompt(201 + len(fault))
    serve_checked(writer, head)
    assert published(writer) == writer.tiers.cache.remote.faults.fired[fault] > 0  # type: ignore[union-attr]
    got = serve_checked(reader, longer(head, 1))
    assert got.cached_by_tier["remote"] == 0  # every record was bad: all recomputed
    counts = store(reader).counts
    assert counts["dropped_bad"] > 0 and counts["loaded"] == 0
    assert set(store(reader).problems) == {reason}
    clean = engine(master)  # the store holds no bad record now: the reader removed them (and put its own)
    serve_checked(clean, longer(head, 2))
    assert store(clean).counts["dropped_bad"] == 0  # (some may be gone: a removal can follow the reader's put)
    clean.close()
    store(reader).release()
    assert store(reader).staging.used_bytes == 0
    writer.close()
    reader.close()
    assert threads() <= before


def test_broken_variant_serving_unchecked_remote_records_changes_outputs(master: MooncakeMaster,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_store, "check_record", lambda *args, **kwargs: None)  # no checks at all
    writer, reader = engine(master, faults=RemoteFaults(flip_byte=1_000)), engine(master)
    head = prompt(251)
    serve_checked(writer, head)
    published(writer)
    tokens = longer(head, 1)
    served = reader.generate(tokens, 3)
    assert served.cached_by_tier["remote"] > 0 and not reader.matches_recompute(tokens, served)
    writer.close()
    reader.close()


def test_the_master_stopped_mid_workload_then_back(own_master: MooncakeMaster) -> None:
    a, b = engine(own_master), engine(own_master, host_bytes=1 << 20)
    head = prompt(301)
    serve_checked(a, head)
    published(a)
    assert serve_checked(b, longer(head, 1)).cached_by_tier["remote"] == 200
    own_master.stop()
    other = prompt(302)
    serve_checked(a, other)  # publishing fails or is skipped: serving goes on
    b.evict("device")
    local = serve_checked(b, longer(head, 2))  # from B's host tier, which kept what it loaded
    assert local.cached_by_tier["host"] == 200
    cold = serve_checked(b, longer(other, 3))  # A's records never reached a store: recomputed
    assert cold.cached_by_tier["remote"] == 0 and store(b).counts["unavailable"] + store(a).counts["unavailable"] > 0
    own_master.start()  # same ports, an empty store: the clients reconnect by themselves
    time.sleep(0.3)  # past retry_s
    attempt = iter(range(310, 400))

    def shared() -> bool:  # each try a new prefix: A computes and publishes it, B (device emptied) looks for it
        fresh = prompt(next(attempt))
        serve_checked(a, fresh)
        published(a)
        b.evict("device")
        return serve_checked(b, longer(fresh, 4)).cached_by_tier["remote"] == 200

    eventually(shared, seconds=20)
    assert store(a).available and store(b).available
    a.close()
    b.close()


def test_a_get_past_its_deadline_is_a_miss_and_the_tier_comes_back(master: MooncakeMaster) -> None:
    a = engine(master)
    slow_s = 4.0  # far past the 0.2 s deadline, and past what serving the request costs on a slow, loaded machine
    b = engine(master, faults=RemoteFaults(slow_get=1, slow_seconds=slow_s), remote={"deadline_s": 0.2})
    head = prompt(401)
    serve_checked(a, head)
    published(a)
    began = time.monotonic()
    late = b.generate(longer(head, 1), 3)
    assert time.monotonic() - began < slow_s  # it did not wait for the slow get
    assert late.cached_by_tier["remote"] == 0 and b.matches_recompute(longer(head, 1), late)
    assert store(b).counts["get_timeout"] > 0 and store(b).counts["unavailable"] == 1  # then skipped for retry_s
    eventually(lambda: store(b).staging.used_bytes == 0, seconds=slow_s + 10)  # the late get's slots come back
    time.sleep(0.3)  # past retry_s
    b.evict("device")
    again = serve_checked(b, longer(head, 2))
    assert again.cached_by_tier["remote"] == 200
    a.close()
    b.close()
