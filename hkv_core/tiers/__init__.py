"""Host and disk tiers: what the manager knows of stored records (their format; the bytes move in executors)."""

from hkv_core.tiers.record import HEADER_BYTES, RecordHeader, pack_header, padded, unpack_header

__all__ = ["HEADER_BYTES", "RecordHeader", "pack_header", "padded", "unpack_header"]
