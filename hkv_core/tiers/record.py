"""The on-disk record format: a 4,096-byte header, then the payload padded to 4,096 bytes.

A record holds the rows of one or more pools for a token range (the engine's
tiers store a block's compressed entries, or a resume point's window and tails).
The header says what it is, so a cache rebuilt from a directory after a
restart trusts nothing it cannot check:

| bytes | field |
| --- | --- |
| 8 | magic `HKVREC\\x00\\x01` |
| 4 | format version (little endian) |
| 16 | layout fingerprint (`Layout.fingerprint()`, 32 hex digits as bytes) |
| 2 + n | object kind (length-prefixed UTF-8) |
| 2 + n | ABI id of the pool (length-prefixed UTF-8) |
| 8 + 8 | token range [start, end) |
| 4 + 16 k | block keys of the range (k keys of 16 bytes) |
| 8 | payload bytes (before padding) |
| 16 | payload checksum (XXH3-128) |
| 16 | header checksum (XXH3-128 of every byte above) |

then zeros to 4,096 bytes.  A torn or altered header fails its own checksum;
a torn or altered payload fails the payload checksum; a record of another
layout fails the fingerprint: each raises RecordCorrupt, never returns bytes.
"""

from __future__ import annotations

import struct

import attrs
import numpy as np
import xxhash
from numpy.typing import NDArray

from hkv_core.errors import RecordCorrupt

__all__ = ["ALIGN_BYTES", "FORMAT_VERSION", "HEADER_BYTES", "MAGIC", "MAX_KEYS", "UNSUMMED", "RecordHeader", "checksum",
           "pack_header", "padded", "unpack_header"]

MAGIC = b"HKVREC\x00\x01"  # a record's first bytes
FORMAT_VERSION = 2  # bumped when the header's or payload's layout changes (older records are then quarantined)
HEADER_BYTES = 4096  # the header, zero padded
ALIGN_BYTES = 4096  # header and payload sizes: direct I/O's alignment
DIGEST_BYTES = 16
UNSUMMED = bytes(DIGEST_BYTES)  # a host record's payload checksum until it goes to disk (computed there)
KEY_BYTES = 16
MAX_TEXT_BYTES = 512  # kind and ABI id
MAX_KEYS = 200  # block keys a header holds (the engine's records name one; the format allows a run of blocks)
_FIXED = struct.Struct("<8sI16s")


def checksum(data: bytes | memoryview | NDArray[np.uint8]) -> bytes:
    """XXH3-128, unseeded: the payload and header checksum (it detects torn and altered bytes; records are
    trusted only within one cache's directory, so it needs no key; about ten times BLAKE2b's speed)."""
    return bytes(xxhash.xxh3_128_digest(data.data if isinstance(data, np.ndarray) else data))


def padded(payload_bytes: int) -> int:
    """Bytes a payload occupies on disk: rounded up to ALIGN_BYTES."""
    return -(-payload_bytes // ALIGN_BYTES) * ALIGN_BYTES


@attrs.frozen(kw_only=True)
class RecordHeader:
    """What a record holds: whose (layout), what (kind, ABI id), which tokens (range, keys), how much, which
    bytes (payload checksum)."""

    layout_fingerprint: str
    kind: str
    abi_id: str
    token_start: int
    token_end: int
    keys: NDArray[np.uint64] = attrs.field(eq=attrs.cmp_using(eq=np.array_equal))  # (k, 2) uint64
    payload_bytes: int
    payload_checksum: bytes

    @property
    def record_bytes(self) -> int:
        """Bytes the whole record takes: the header, then the payload padded to ALIGN_BYTES."""
        return HEADER_BYTES + padded(self.payload_bytes)

    def __attrs_post_init__(self) -> None:
        assert len(self.layout_fingerprint) == 32, self.layout_fingerprint
        assert 0 <= self.token_start <= self.token_end and self.payload_bytes >= 0
        assert self.keys.ndim == 2 and self.keys.shape[1] == 2 and len(self.keys) <= MAX_KEYS, self.keys.shape
        assert len(self.payload_checksum) == DIGEST_BYTES


def _text(value: str) -> bytes:
    data = value.encode("utf-8")
    assert len(data) <= MAX_TEXT_BYTES, value
    return struct.pack("<H", len(data)) + data


def pack_header(header: RecordHeader) -> bytes:
    """The header's HEADER_BYTES bytes."""
    keys = np.ascontiguousarray(header.keys, dtype="<u8").tobytes()
    body = (_FIXED.pack(MAGIC, FORMAT_VERSION, bytes.fromhex(header.layout_fingerprint))
            + _text(header.kind) + _text(header.abi_id)
            + struct.pack("<QQI", header.token_start, header.token_end, len(header.keys)) + keys
            + struct.pack("<Q", header.payload_bytes) + header.payload_checksum)
    body += checksum(body)
    assert len(body) <= HEADER_BYTES
    return body + bytes(HEADER_BYTES - len(body))


class _Reader:
    def __init__(self, data: bytes, record: str, tier: str) -> None:
        self.data, self.at, self.record, self.tier = data, 0, record, tier

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise RecordCorrupt(tier=self.tier, record=self.record, reason="header truncated")
        out = self.data[self.at:self.at + n]
        self.at += n
        return out

    def text(self) -> str:
        (n,) = struct.unpack("<H", self.take(2))
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise RecordCorrupt(tier=self.tier, record=self.record, reason="header text is not UTF-8") from None


def unpack_header(data: bytes, record: str = "?", tier: str = "disk") -> RecordHeader:
    """The header of a record's first HEADER_BYTES bytes; RecordCorrupt (naming `tier` and `record`) when anything
    does not check."""
    if len(data) < HEADER_BYTES:
        raise RecordCorrupt(tier=tier, record=record, reason=f"header of {len(data)} bytes, not {HEADER_BYTES}")
    r = _Reader(data, record, tier)
    magic, version, fingerprint = _FIXED.unpack(r.take(_FIXED.size))
    if magic != MAGIC:
        raise RecordCorrupt(tier=tier, record=record, reason="not an hkv record (bad magic)")
    if version != FORMAT_VERSION:
        raise RecordCorrupt(tier=tier, record=record, reason=f"format version {version}, not {FORMAT_VERSION}")
    kind, abi_id = r.text(), r.text()
    start, end, count = struct.unpack("<QQI", r.take(20))
    if count > MAX_KEYS:
        raise RecordCorrupt(tier=tier, record=record, reason=f"{count} keys, more than {MAX_KEYS}")
    keys = np.frombuffer(r.take(KEY_BYTES * count), "<u8").reshape(count, 2).astype(np.uint64)
    (payload_bytes,) = struct.unpack("<Q", r.take(8))
    payload_checksum, body_end = r.take(DIGEST_BYTES), r.at
    if r.take(DIGEST_BYTES) != checksum(data[:body_end]):
        raise RecordCorrupt(tier=tier, record=record, reason="header checksum mismatch (torn or altered)")
    if start > end:
        raise RecordCorrupt(tier=tier, record=record, reason=f"token range [{start}, {end}) is empty backwards")
    return RecordHeader(layout_fingerprint=fingerprint.hex(), kind=kind, abi_id=abi_id, token_start=start,
                        token_end=end, keys=keys, payload_bytes=payload_bytes, payload_checksum=payload_checksum)
