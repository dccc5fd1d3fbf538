"""ZmqEventPublisher: send each batch of `CacheManager.take_events()` on a ZeroMQ PUB socket.

Messages are three frames, as vLLM's publisher sends them: the topic, an
8-byte big-endian sequence number (consecutive from 0: a subscriber that
sees a gap knows it missed batches), and the msgpack batch (`wire.py`).
PUB sockets never block: beyond the high-water mark ZeroMQ drops messages,
which the sequence numbers reveal.  Sending runs on the caller's thread.
A tcp port outside 1..65535 (ZeroMQ would wrap 99999 to 34463), an endpoint
ZeroMQ refuses, and any call after `close()` raise InvalidArgument.
"""

from __future__ import annotations

from types import TracebackType

import zmq

from hkv_core import events as ev
from hkv_core.errors import InvalidArgument
from hkv_events.wire import encode_batch_counted

__all__ = ["DEFAULT_HWM", "MAX_PORT", "ZmqEventPublisher"]

DEFAULT_HWM = 100_000  # messages queued per subscriber before ZeroMQ drops
MAX_PORT = 65_535  # a tcp endpoint's port is 1..MAX_PORT (a bind may also ask for any free one: `*` or 0)


class ZmqEventPublisher:
    """PUB socket bound (`tcp://*:5557`) or connected (`tcp://host:5557`) at `endpoint`."""

    def __init__(self, endpoint: str, *, topic: str = "", hkv_events: bool = True, rank: int | None = None,
                 hwm: int = DEFAULT_HWM, context: zmq.Context[zmq.Socket[bytes]] | None = None) -> None:
        binding = "*" in endpoint or endpoint.startswith(("inproc://", "ipc://"))
        _check_port(endpoint, binding)
        self._context = context or zmq.Context.instance()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.set_hwm(hwm)
        try:
            if binding:
                self._socket.bind(endpoint)
            else:
                self._socket.connect(endpoint)
        except zmq.ZMQError as err:
            self._socket.close(linger=0)
            raise InvalidArgument(action="ZmqEventPublisher", argument="endpoint", value=endpoint,
                                  reason=f"ZeroMQ refused it: {err}") from None
        self._topic, self._hkv_events, self._rank = topic.encode(), hkv_events, rank
        self.sequence = 0  # of the next batch
        self._closed = False
        self.events_dropped = 0  # events that could not be encoded (the rest of their batch was sent)

    @property
    def endpoint(self) -> str:
        """The address bound or connected (with the port a `tcp://*:0` bind picked)."""
        self._check_open("endpoint")
        last = self._socket.getsockopt(zmq.LAST_ENDPOINT)
        return last.decode() if isinstance(last, bytes) else str(last)

    def publish(self, events: list[ev.KVEvent]) -> int:
        """Send one batch (nothing when `events` is empty); returns its sequence number, or -1.  An event that
        cannot be encoded is dropped, never its batch (`encode_batch`; counted in `events_dropped`)."""
        self._check_open("publish")
        if not events:
            return -1
        payload, dropped = encode_batch_counted(events, hkv_events=self._hkv_events, rank=self._rank)
        self.events_dropped += dropped
        seq, self.sequence = self.sequence, self.sequence + 1
        self._socket.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        return seq

    def close(self) -> None:
        """Close the socket (again: nothing); every later call raises InvalidArgument."""
        self._closed = True
        self._socket.close(linger=0)

    def _check_open(self, action: str) -> None:
        if self._closed:
            raise InvalidArgument(action=action, argument="publisher", value="closed",
                                  reason="this publisher was closed; make a new one")

    def __enter__(self) -> ZmqEventPublisher:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


def _check_port(endpoint: str, binding: bool) -> None:
    """InvalidArgument unless a tcp endpoint's port is in 1..MAX_PORT (or, for a bind, `*` or 0: any free port)."""
    if not endpoint.startswith("tcp://"):
        return
    port = endpoint.rpartition(":")[2]
    if binding and port in ("*", "0"):
        return
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= MAX_PORT):
        raise InvalidArgument(action="ZmqEventPublisher", argument="endpoint", value=endpoint,
                              reason=f"the tcp port must be in 1..{MAX_PORT}" + (" (or * / 0: any free port)"
                                                                                 if binding else ""))
