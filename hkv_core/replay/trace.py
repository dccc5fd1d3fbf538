"""Mooncake-format request traces: one JSON object per line, read whole and checked before any replay.

Fields: `timestamp` (ms, >= 0), `input_length` (tokens, >= 1), `output_length`
(tokens, >= 0), `hash_ids` (one per block of `block_tokens` prompt tokens,
prefix-chained: equal id at equal position means an equal prefix up to it;
`len(hash_ids) == ceil(input_length / block_tokens)`, the last block may be
partial).  A malformed line raises ConfigError naming the line and the field;
nothing is replayed from a trace with one bad line.  The trace must be a
regular file (a FIFO would block, a device never end) of at most
MAX_TRACE_BYTES, each line at most MAX_TRACE_LINE_BYTES: it is read line by
line, so nothing past those limits is ever held in memory.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import attrs
import numpy as np
from numpy.typing import NDArray

from hkv_core.errors import ConfigError

__all__ = ["MAX_TRACE_BYTES", "MAX_TRACE_LINE_BYTES", "TraceRequest", "check_requests", "prompt_of", "read_trace"]

MAX_TRACE_BYTES = 1 << 30  # a trace is read whole: at most 1 GiB (the shared Mooncake trace is 3.6 MB)
MAX_TRACE_LINE_BYTES = 1 << 20  # one line, its newline included: about 90,000 hash ids (the trace's longest: 2 KB)
MAX_HASH_ID = 2**31 - 1  # a block's first token is its hash id: token ids are below 2**31


@attrs.frozen(kw_only=True)
class TraceRequest:
    """One trace line."""

    timestamp: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _int(line: int, source: str, record: dict[str, object], key: str, low: int) -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"line {line}: must be an integer >= {low}, got {value!r}", source=source, key=key)
    return value


def _request(line: int, source: str, text: str, block_tokens: int) -> TraceRequest:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"line {line}: not JSON ({err.msg})", source=source, key="line") from None
    except (ValueError, RecursionError) as err:  # an integer of thousands of digits, nesting past the stack
        raise ConfigError(f"line {line}: not a trace record ({type(err).__name__})", source=source,
                          key="line") from None
    if not isinstance(record, dict):
        raise ConfigError(f"line {line}: not a JSON object", source=source, key="line")
    stamp = record.get("timestamp")
    if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not 0 <= stamp < float("inf"):
        raise ConfigError(f"line {line}: must be a number >= 0, got {stamp!r}", source=source, key="timestamp")
    length = _int(line, source, record, "input_length", 1)
    out = _int(line, source, record, "output_length", 0)
    ids = record.get("hash_ids")
    if not isinstance(ids, list) or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= MAX_HASH_ID
                                        for i in ids):
        raise ConfigError(f"line {line}: must be a list of integers in [0, {MAX_HASH_ID}]", source=source,
                          key="hash_ids")
    if len(ids) != -(-length // block_tokens):
        raise ConfigError(f"line {line}: {len(ids)} hash ids for {length} tokens in blocks of {block_tokens} "
                          f"(needs {-(-length // block_tokens)})", source=source, key="hash_ids")
    return TraceRequest(timestamp=float(stamp), input_length=length, output_length=out, hash_ids=tuple(ids))


def read_trace(path: str | Path, block_tokens: int) -> list[TraceRequest]:
    """Every request of the trace at `path`, in timestamp order (stable); ConfigError for a missing or
    oversized file or any malformed line."""
    source = str(path)
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise ConfigError(f"must be an integer >= 1, got {block_tokens!r}", source=source, key="block_tokens")
    with _open_regular(path, source) as handle:
        numbered = [(i, _request(i, source, text, block_tokens)) for i, text in _lines(handle, source)
                    if text.strip()]
    if not numbered:
        raise ConfigError("no requests in the trace", source=source, key="file")
    _check_prefixes(numbered, source)
    return sorted((r for _, r in numbered), key=lambda r: r.timestamp)


def _open_regular(path: str | Path, source: str) -> BinaryIO:
    """`path` opened for reading, ConfigError unless it is a regular file of at most MAX_TRACE_BYTES.  Opened
    non-blocking, so a FIFO is refused at once rather than waited on."""
    def fail(why: str) -> ConfigError:
        return ConfigError(why, source=source, key="file")

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise fail(f"cannot read the trace: {err.strerror or err}") from None
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode) or status.st_size > MAX_TRACE_BYTES:
        os.close(fd)
        raise fail("not a regular file (a FIFO would block, a device never end)"
                   if not stat.S_ISREG(status.st_mode) else f"larger than {MAX_TRACE_BYTES:,} bytes")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _lines(handle: BinaryIO, source: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line; ConfigError for a line over MAX_TRACE_LINE_BYTES, a file grown past
    MAX_TRACE_BYTES or text that is not UTF-8.  Never holds more than one line."""
    total = 0
    for number, raw in enumerate(iter(lambda: handle.readline(MAX_TRACE_LINE_BYTES + 1), b""), 1):
        total += len(raw)
        if total > MAX_TRACE_BYTES:
            raise ConfigError(f"larger than {MAX_TRACE_BYTES:,} bytes", source=source, key="file")
        if len(raw) > MAX_TRACE_LINE_BYTES:
            raise ConfigError(f"line {number}: longer than {MAX_TRACE_LINE_BYTES:,} bytes", source=source,
                              key="line")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(f"line {number}: not UTF-8 (byte {err.start})", source=source, key="line") from None
        yield number, text


def _check_prefixes(numbered: list[tuple[int, TraceRequest]], source: str) -> None:
    """ConfigError naming the line where a block id at a position follows another parent than before (the
    format's hash ids are prefix-chained: an equal id at an equal position means an equal prefix)."""
    parent: dict[tuple[int, int], int] = {}
    for line, request in numbered:
        for j, block in enumerate(request.hash_ids):
            before = request.hash_ids[j - 1] if j else -1
            if parent.setdefault((j, block), before) != before:
                raise ConfigError(f"line {line}: hash id {block} at block {j} follows {before}, earlier "
                                  f"{parent[(j, block)]}: not prefix-chained", source=source, key="hash_ids")


def check_requests(requests: Sequence[TraceRequest], block_tokens: int) -> None:
    """What `read_trace` checks, for requests built directly: ConfigError for none, hash ids that do not match
    `block_tokens`, or a trace that is not prefix-consistent (lines numbered from 1 in the given order)."""
    if not requests:
        raise ConfigError("no requests in the trace", source="requests", key="file")
    for line, r in enumerate(requests, 1):
        if len(r.hash_ids) != -(-r.input_length // block_tokens):
            raise ConfigError(f"line {line}: {len(r.hash_ids)} hash ids for {r.input_length} tokens in blocks "
                              f"of {block_tokens}", source="requests", key="hash_ids")
    _check_prefixes(list(enumerate(requests, 1)), "requests")


def prompt_of(request: TraceRequest, block_tokens: int) -> NDArray[np.int64]:
    """A request's prompt tokens: each block is its hash id then zeros (blocks of different ids differ in their
    first token), the last block cut to `input_length`."""
    tokens = np.zeros(len(request.hash_ids) * block_tokens, np.int64)
    tokens[::block_tokens] = request.hash_ids
    return tokens[:request.input_length]
