"""What a load asks a tier for, and the check every record passes before it is served (host, disk, remote).

A record is named by its block key (`record_name`); a load names the records it wants (`Wanted`: kind, key,
token range, payload length) and `check_record` compares a record's header and payload with them - layout,
kind, ABI id, token range, key, length, checksum - raising RecordCorrupt on the first difference.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.errors import RecordCorrupt
from hkv_core.layout import PoolSpec
from hkv_core.tiers.record import RecordHeader, checksum
from hkv_tiers.span_io import BLOCK, POINT

Buffer = bytes | memoryview | NDArray[np.uint8]  # what records are written from and read into


def record_name(key: NDArray[np.uint64], kind: str = BLOCK) -> str:
    """A record's name: its block key (2 uint64) as 32 hex digits, `-p` after it for a point record."""
    return np.asarray(key, "<u8").tobytes().hex() + ("-p" if kind == POINT else "")


@attrs.frozen
class Wanted:
    """A record a load asks for: its name, kind, block key and token range (each checked against the header)."""

    kind: str
    key: NDArray[np.uint64] = attrs.field(eq=False)
    lo: int
    hi: int
    nbytes: int = -1  # the payload length the layout gives it (-1: not checked)

    @property
    def name(self) -> str:
        return record_name(self.key, self.kind)


Loaded = tuple[str, Buffer, float]  # (tier, payload (a view: use it before the next put / fetch), seconds taken)


def span_abi_id(pools: Sequence[PoolSpec]) -> str:
    """One id for the ABI ids of every pool a span holds."""
    return "span/" + hashlib.blake2b("\n".join(p.abi_id for p in pools).encode(), digest_size=16).hexdigest()


def check_record(tier: str, header: RecordHeader, payload: Buffer, want: Wanted, *, fingerprint: str, abi_id: str,
                 checked: bool = False) -> None:
    """RecordCorrupt unless the record is the wanted one of this layout (`fingerprint`, `abi_id`), with intact
    bytes (`checked`: its payload checksum was already verified)."""
    lo, hi = want.lo, want.hi
    problem = ("a record of another layout" if header.layout_fingerprint != fingerprint
               else f"kind {header.kind!r}, not {want.kind!r}" if header.kind != want.kind
               else "another ABI id" if header.abi_id != abi_id
               else f"tokens [{header.token_start}, {header.token_end}), not [{lo}, {hi})"
               if (header.token_start, header.token_end) != (lo, hi)
               else "another block key" if not np.array_equal(header.keys, np.asarray(want.key).reshape(1, 2))
               else "payload length mismatch" if len(payload) != header.payload_bytes
               else f"{header.payload_bytes} payload bytes, the layout's record has {want.nbytes}"
               if want.nbytes >= 0 and header.payload_bytes != want.nbytes
               else "payload checksum mismatch" if not checked and checksum(payload) != header.payload_checksum
               else "")
    if problem:
        raise RecordCorrupt(tier=tier, record=want.name, reason=problem)
