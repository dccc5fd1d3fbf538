"""Publish hkv's KV cache events to routers: ZeroMQ PUB, msgspec (msgpack) encoding, vLLM 0.33's wire format.

Needs the `events` extra (`pip install 'hkv[events]'`: pyzmq, msgspec).  The
events themselves (`hkv_core.events`) and `CacheManager.take_events()` need
neither; see docs/events.md.
"""

from hkv_events.publisher import ZmqEventPublisher
from hkv_events.wire import WireBatch, decode_batch, encode_batch

__all__ = ["WireBatch", "ZmqEventPublisher", "decode_batch", "encode_batch"]
