"""The ZeroMQ publisher: a subscriber receives every batch, in order, and decodes the events it was sent."""

from __future__ import annotations

import numpy as np
import pytest

zmq = pytest.importorskip("zmq", reason="the events extra (pyzmq) is not installed")
pytest.importorskip("msgspec", reason="the events extra (msgspec) is not installed")

from hkv_core.errors import InvalidArgument  # noqa: E402
from hkv_core.events import AllBlocksCleared, BlockRemoved, BlockStored, ResumePointStored  # noqa: E402
from hkv_core.layout import Layout  # noqa: E402
from hkv_core.manager import CacheManager, ManagerConfig  # noqa: E402
from hkv_core.testing.serving import serve_whole  # noqa: E402
from hkv_events import (  # noqa: E402
    ZmqEventPublisher,
    decode_batch,
    encode_batch,
    wire,  # noqa: E402
)

TOPIC = "kv@instance-0"


def served(m: CacheManager, tokens: np.ndarray) -> None:
    serve_whole(m, tokens)


def receive(sub: zmq.Socket[bytes], pub: ZmqEventPublisher, events: list[object]) -> tuple[int, bytes]:
    """Publish `events` until the subscriber (slow to join) gets one; (sequence, payload) received."""
    for _ in range(100):
        pub.publish(events)  # type: ignore[arg-type]
        if sub.poll(50):
            topic, seq, payload = sub.recv_multipart()
            assert topic == TOPIC.encode()
            return int.from_bytes(seq, "big"), payload
    raise AssertionError("the subscriber never received a batch")


def test_a_subscriber_decodes_the_managers_events_in_order() -> None:
    m = CacheManager(Layout.from_preset("tiny_v4", block_tokens=8), ManagerConfig(key_seed=1, kv_events=True))
    context = zmq.Context()
    with ZmqEventPublisher("tcp://127.0.0.1:*", topic=TOPIC, context=context) as pub:
        sub = context.socket(zmq.SUB)
        sub.connect(pub.endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
        first, _ = receive(sub, pub, [AllBlocksCleared()])
        served(m, np.arange(200))
        sent = m.take_events()
        assert {type(e) for e in sent} == {BlockStored, ResumePointStored}
        seq = pub.publish(sent)
        assert sub.poll(2000)
        _, seq_bytes, payload = sub.recv_multipart()
        assert int.from_bytes(seq_bytes, "big") == seq == first + 1  # consecutive: nothing missed
        batch = decode_batch(payload)
        assert batch.events == [wire.to_wire(e) for e in sent]
        stored = batch.events[0]
        assert isinstance(stored, wire.BlockStored)
        assert stored.token_ids == list(range(len(stored.block_hashes) * 8))
        sub.close(linger=0)
    context.term()


def test_vllm_only_batches_leave_hkvs_own_kinds_out() -> None:
    events = [BlockStored(block_hashes=(b"k" * 16,), parent_block_hash=None, token_ids=tuple(range(8)),
                          block_size=8),
              ResumePointStored(block_hash=b"k" * 16, position_tokens=8)]
    assert [type(e).__name__ for e in decode_batch(encode_batch(events)).events] == ["BlockStored",
                                                                                    "ResumePointStored"]
    assert [type(e).__name__ for e in decode_batch(encode_batch(events, hkv_events=False)).events] == [
        "BlockStored"]


def test_a_router_built_on_vllm_decodes_hkvs_block_events() -> None:
    """vLLM 0.33's own message types (restated in vllm_wire.py) decode a batch published without hkv's kinds."""
    import msgspec
    import vllm_wire

    m = CacheManager(Layout.from_preset("tiny_v4", block_tokens=8), ManagerConfig(key_seed=1, kv_events=True))
    served(m, np.arange(200))
    m.evict()  # every unit: BlockRemoved (and hkv's ResumePointRemoved)
    served(m, np.arange(100))
    m.clear_cache()
    sent = m.take_events()
    assert {BlockStored, BlockRemoved, AllBlocksCleared} <= {type(e) for e in sent}
    decoded = msgspec.msgpack.Decoder(vllm_wire.KVEventBatch).decode(encode_batch(sent, hkv_events=False))
    blocks = [e for e in sent if isinstance(e, (BlockStored, BlockRemoved, AllBlocksCleared))]
    assert len(decoded.events) == len(blocks) >= 2
    for ours, theirs in zip(blocks, decoded.events, strict=True):
        assert type(theirs).__name__ == type(ours).__name__
        if isinstance(ours, BlockRemoved):
            assert isinstance(theirs, vllm_wire.BlockRemoved) and theirs.block_hashes == list(ours.block_hashes)
        if isinstance(ours, BlockStored):
            assert isinstance(theirs, vllm_wire.BlockStored)
            assert (theirs.block_hashes, theirs.parent_block_hash, theirs.token_ids, theirs.block_size,
                    theirs.medium) == (list(ours.block_hashes), ours.parent_block_hash, list(ours.token_ids),
                                       ours.block_size, ours.medium)
    with pytest.raises(msgspec.ValidationError):  # hkv's own kinds are unknown to vLLM's union
        msgspec.msgpack.Decoder(vllm_wire.KVEventBatch).decode(encode_batch(sent))


def test_a_malformed_payload_is_refused() -> None:
    import msgspec

    with pytest.raises(msgspec.DecodeError):
        decode_batch(b"\xc1 not msgpack")


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:99999", "tcp://127.0.0.1:0", "tcp://127.0.0.1:-1",
                                      "tcp://*:65536", "tcp://127.0.0.1:port", "tcp://127.0.0.1"])
def test_a_port_out_of_range_is_refused(endpoint: str) -> None:
    """issue 27 (12): ZeroMQ wrapped port 99999 to 34463 and connected there."""
    with pytest.raises(InvalidArgument) as err:
        ZmqEventPublisher(endpoint, context=zmq.Context())
    assert err.value.argument == "endpoint" and err.value.value == endpoint, err.value
    assert "1..65535" in err.value.reason or "refused" in err.value.reason


def test_a_closed_publisher_raises_a_typed_error() -> None:
    """issue 27 (12): publishing after close() raised a raw ZMQError."""
    pub = ZmqEventPublisher("tcp://127.0.0.1:*", context=zmq.Context())
    assert pub.endpoint.startswith("tcp://127.0.0.1:")
    pub.close()
    pub.close()  # again: nothing
    for call in (lambda: pub.publish([AllBlocksCleared()]), lambda: pub.endpoint):
        with pytest.raises(InvalidArgument, match="closed") as err:
            call()
        assert err.value.argument == "publisher"
    assert pub.sequence == 0  # no batch was numbered
    with ZmqEventPublisher("tcp://127.0.0.1:65535", context=zmq.Context()) as edge:  # connect: lazy, any port
        assert edge.sequence == 0


def stored(lora_id: int | None, key: bytes = b"k") -> BlockStored:
    return BlockStored(block_hashes=(key * 16,), parent_block_hash=None, token_ids=tuple(range(8)), block_size=8,
                       lora_id=lora_id)


def test_one_event_that_cannot_be_encoded_never_costs_its_batch() -> None:
    events = [stored(None, b"a"), stored(2**70, b"b"), stored(-(2**70), b"c"), stored(7, b"d"),
              ResumePointStored(block_hash=b"d" * 16, position_tokens=8)]
    batch = decode_batch(encode_batch(events))  # a raw OverflowError lost every event of the batch
    assert [type(e).__name__ for e in batch.events] == ["BlockStored", "EventsLost", "BlockStored",
                                                        "ResumePointStored"]
    lost = batch.events[1]
    assert isinstance(lost, wire.EventsLost) and lost.count == 2
    assert [e.block_hashes for e in batch.events if isinstance(e, wire.BlockStored)] == [[b"a" * 16], [b"d" * 16]]
    vllm_only = decode_batch(encode_batch(events, hkv_events=False))
    assert [type(e).__name__ for e in vllm_only.events] == ["BlockStored", "BlockStored"]
    assert wire.encode_batch_counted(events)[1] == 2 and wire.encode_batch_counted(events[:1])[1] == 0
    context = zmq.Context()
    with ZmqEventPublisher("tcp://127.0.0.1:*", topic=TOPIC, context=context) as pub:
        sub = context.socket(zmq.SUB)
        sub.connect(pub.endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
        receive(sub, pub, [AllBlocksCleared()])
        seq = pub.publish(events)  # type: ignore[arg-type]
        assert sub.poll(2000)
        _, seq_bytes, payload = sub.recv_multipart()
        assert int.from_bytes(seq_bytes, "big") == seq and len(decode_batch(payload).events) == 4
        assert pub.events_dropped == 2
        sub.close(linger=0)
    context.term()


def test_an_adapter_id_past_64_bits_is_refused_at_add_request_so_events_always_encode() -> None:
    m = CacheManager(Layout.from_preset("tiny_v4", block_tokens=8), ManagerConfig(key_seed=1, kv_events=True))
    before = m.snapshot()
    for bad in (2**64, -1, 2**100):
        with pytest.raises(InvalidArgument) as info:
            m.add_request(np.arange(40), lora_id=bad)
        assert info.value.argument == "lora_id" and info.value.value == bad
    assert m.snapshot() == before
    rid = m.add_request(np.arange(40), lora_id=2**64 - 1)  # the largest that fits the wire's 64 bits
    m.allocate(rid, 40)
    m.commit(rid, 40)
    m.release(rid)
    batch = decode_batch(encode_batch(m.take_events()))
    assert {e.lora_id for e in batch.events if isinstance(e, wire.BlockStored)} == {2**64 - 1}
