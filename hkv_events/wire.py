"""The wire format of an event batch: vLLM's KV event messages, plus hkv's own event kinds.

A batch is a msgpack array `[ts, events, data_parallel_rank]`; each event a
msgpack map tagged with its class name (`"type": "BlockStored"`), field
names as vLLM 0.33's `vllm.distributed.kv_events`, so that a router decoding
vLLM 0.33's messages decodes hkv's block events (older vLLM releases encoded
each event as an array: their decoders do not read these).  hkv's own kinds
(`ResumePointStored`, `ResumePointRemoved`, `EventsLost`) are left out when
a publisher is built with `hkv_events=False`, for decoders that know only
vLLM's union.
"""

from __future__ import annotations

import time

import attrs
import msgspec

from hkv_core import events as ev

__all__ = ["HKV_ONLY", "AllBlocksCleared", "BlockRemoved", "BlockStored", "EventsLost", "ResumePointRemoved",
           "ResumePointStored", "WireBatch", "WireEvent", "decode_batch", "encode_batch", "encode_batch_counted",
           "to_wire"]


class _Event(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of every wire event (tagged by class name)."""


class BlockStored(_Event):
    """`hkv_core.events.BlockStored` on the wire (vLLM's fields and tag)."""

    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(_Event):
    """`hkv_core.events.BlockRemoved` on the wire (vLLM's fields and tag)."""

    block_hashes: list[bytes]
    medium: str | None


class AllBlocksCleared(_Event):
    """`hkv_core.events.AllBlocksCleared` on the wire (vLLM's tag)."""


class ResumePointStored(_Event):
    """`hkv_core.events.ResumePointStored` on the wire (hkv's own event)."""

    block_hash: bytes
    position_tokens: int
    medium: str | None


class ResumePointRemoved(_Event):
    """`hkv_core.events.ResumePointRemoved` on the wire (hkv's own event)."""

    block_hashes: list[bytes]
    medium: str | None


class EventsLost(_Event):
    """`hkv_core.events.EventsLost` on the wire (hkv's own event)."""

    count: int


WireEvent = BlockStored | BlockRemoved | AllBlocksCleared | ResumePointStored | ResumePointRemoved | EventsLost
HKV_ONLY = (ev.ResumePointStored, ev.ResumePointRemoved, ev.EventsLost)  # events vLLM's format lacks


class WireBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One published message: a timestamp (seconds since the epoch) and events in order."""

    ts: float
    events: list[WireEvent]
    data_parallel_rank: int | None = None


WIRE: dict[type, type[_Event]] = {ev.BlockStored: BlockStored, ev.BlockRemoved: BlockRemoved,
                                  ev.AllBlocksCleared: AllBlocksCleared, ev.ResumePointStored: ResumePointStored,
                                  ev.ResumePointRemoved: ResumePointRemoved, ev.EventsLost: EventsLost}


def to_wire(event: ev.KVEvent) -> WireEvent:
    """The wire struct of one hkv event: the fields its struct has (tuples as lists), by name."""
    struct = WIRE[type(event)]
    fields = attrs.asdict(event, recurse=False)
    wired = struct(**{name: list(v) if isinstance(v := fields[name], tuple) else v
                      for name in struct.__struct_fields__})
    return wired  # type: ignore[return-value]  # one of WireEvent's members, by WIRE


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(WireBatch)


def encode_batch(events: list[ev.KVEvent], *, hkv_events: bool = True, rank: int | None = None) -> bytes:
    """msgpack bytes of one batch of `events` (hkv's own kinds left out unless `hkv_events`).

    One event that cannot be encoded (a field out of msgpack's range, such as an adapter id past 64 bits, or
    not an hkv event at all) never costs the batch: the others are sent, and with `hkv_events` an
    `EventsLost(count)` takes the place of those dropped (`encode_batch_counted` also says how many)."""
    return encode_batch_counted(events, hkv_events=hkv_events, rank=rank)[0]


def encode_batch_counted(events: list[ev.KVEvent], *, hkv_events: bool = True,
                         rank: int | None = None) -> tuple[bytes, int]:
    """`encode_batch`'s bytes and the number of events dropped because they could not be encoded."""
    ts = time.time()
    try:
        kept = [to_wire(e) for e in events if hkv_events or not isinstance(e, HKV_ONLY)]
        return _ENCODER.encode(WireBatch(ts=ts, events=kept, data_parallel_rank=rank)), 0
    except Exception:  # noqa: BLE001  # find the bad events one by one (the rare path)
        pass
    wired: list[WireEvent] = []
    dropped = 0
    for event in events:
        if not hkv_events and isinstance(event, HKV_ONLY):
            continue
        try:
            one = to_wire(event)
            _ENCODER.encode(one)
        except Exception:  # noqa: BLE001  # any event msgpack or the wire structs refuse
            dropped += 1
            if hkv_events and (not wired or not isinstance(wired[-1], EventsLost)):
                wired.append(EventsLost(count=0))
            if hkv_events:
                lost = wired[-1]
                assert isinstance(lost, EventsLost)
                lost.count += 1
            continue
        wired.append(one)
    return _ENCODER.encode(WireBatch(ts=ts, events=wired, data_parallel_rank=rank)), dropped


def decode_batch(payload: bytes) -> WireBatch:
    """A batch from its bytes (msgspec.ValidationError / DecodeError when malformed)."""
    return _DECODER.decode(payload)
