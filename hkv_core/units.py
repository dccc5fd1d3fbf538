"""Every conversion between tokens, compressed entries, tail rows, window rows and pages.

This is the ONE module that knows how these units relate (``docs/failures.md`` F12:
vLLM #55600 mixed tokens with compressed entries).  Every name ends in its
unit: ``*_tokens`` (a count or an absolute position in the token stream),
``*_entries`` (compressed entries, one per ``ratio`` tokens), ``*_rows``
(one row per token: compressor tail rows, sliding-window rows), ``*_pages``
and ``*_bytes``.  Token positions are absolute, counted from 0; a prefix of
``prefix_tokens`` tokens covers positions ``[0, prefix_tokens)``.

Compress ratio ``r`` (``docs/v4_cache.md`` sections 1, 2, 6):

- ``r == 0``: sliding-window only (SWA), no compressed entries and no tail;
- ``r == 1``: identity compressor (classic full attention): one entry per
  token, no tail;
- ``r == 4``: CSA, overlapping compressor: the tail keeps the previous complete
  block (4 overlap rows, the padding sentinel before the first block completes)
  plus ``P mod 4`` remainder rows;
- ``r`` a power of two ``>= 8``: HCA, the tail keeps ``P mod r`` rows.

Every function raises ``UnitError`` on a negative or non-integer argument.
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np

from hkv_core.errors import UnitError

__all__ = ["MIN_HCA_RATIO", "NO_WINDOW_TOKENS", "NULL_PAGE", "OVERLAP_FACTOR", "OVERLAP_RATIO", "TOKENS_PER_ROW",
           "aligned_entries_per_page", "as_count", "bytes_for_entries", "checked_ratio", "compressed_entries",
           "entries_for_pages", "entry_last_token", "entry_start_token", "entry_tokens", "is_supported_ratio",
           "overlap_factor", "page_index_for_entry", "pages_for_entries", "pages_for_tokens", "tail_overlap_rows",
           "tail_padding_rows", "tail_remainder_rows", "tail_rows", "tail_rows_max", "tail_start_token",
           "state_entries", "state_start_token",
           "tokens_per_entry", "tokens_per_page", "visible_entries", "window_rows", "window_rows_max",
           "window_start_token"]

OVERLAP_RATIO = 4  # the only ratio whose compressor windows overlap (c = 2)
OVERLAP_FACTOR = 2  # c for the overlapping ratio: (a, z) rows are c*d wide
MIN_HCA_RATIO = 8  # smallest heavily-compressed ratio; HCA ratios are powers of two
TOKENS_PER_ROW = 1  # tail rows and window rows hold one token each
NO_WINDOW_TOKENS = 0  # window_tokens of a layer without a sliding window
NULL_PAGE = 0  # page 0 of every pool: never allocated or written; what a skipped table entry points at

assert OVERLAP_RATIO < MIN_HCA_RATIO
assert OVERLAP_FACTOR * OVERLAP_RATIO == 2 * OVERLAP_RATIO  # window 8, stride 4


def as_count(name: str, value: object, *, minimum: int = 0) -> int:
    """Return ``value`` as an int if it is an integer ``>= minimum``, else raise ``UnitError``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise UnitError(f"must be an int, got {type(value).__name__}", name=name,
                        value=cast(int, value))
    if value < minimum:
        raise UnitError(f"must be >= {minimum}", name=name, value=int(value))
    return int(value)


def is_supported_ratio(ratio: int) -> bool:
    """True for the compress ratios hkv supports: 0, 1, 4 and powers of two ``>= 8``."""
    if ratio in (0, 1, OVERLAP_RATIO):
        return True
    return ratio >= MIN_HCA_RATIO and ratio & (ratio - 1) == 0


def checked_ratio(ratio: object) -> int:
    """Return ``ratio`` as an int if supported; else raise ``UnitError``."""
    value = as_count("ratio", ratio)
    if not is_supported_ratio(value):
        raise UnitError("unsupported compress ratio (0, 1, 4 or a power of two >= 8)",
                        name="ratio", value=value)
    return value


# ------------------------------------------------------------ compressed entries


def tokens_per_entry(ratio: int) -> int:
    """Tokens one compressed entry covers (``r``); SWA layers (r=0) have no entries."""
    r = checked_ratio(ratio)
    if r == 0:
        raise UnitError("ratio 0 (SWA) has no compressed entries", name="ratio", value=r)
    return r


def compressed_entries(prefix_tokens: int, ratio: int) -> int:
    """Complete compressed entries of a prefix: entries ``j < floor(P / r)`` (0 for SWA)."""
    p, r = as_count("prefix_tokens", prefix_tokens), checked_ratio(ratio)
    return 0 if r == 0 else p // r


def entry_tokens(entries: int, ratio: int) -> int:
    """Tokens covered by ``entries`` complete compressed entries (``entries * r``)."""
    return as_count("entries", entries) * tokens_per_entry(ratio)


def entry_start_token(entry_index: int, ratio: int) -> int:
    """First token of compressed entry ``j`` (``j * r``); also its rope position."""
    return as_count("entry_index", entry_index) * tokens_per_entry(ratio)


def entry_last_token(entry_index: int, ratio: int) -> int:
    """Token whose processing completes entry ``j``: ``j * r + r - 1``."""
    return entry_start_token(entry_index, ratio) + tokens_per_entry(ratio) - 1


def visible_entries(query_token: int, ratio: int) -> int:
    """Entries visible to the query at position ``t``: ``j < floor((t + 1) / r)``."""
    t, r = as_count("query_token", query_token), checked_ratio(ratio)
    return 0 if r == 0 else (t + 1) // r


def overlap_factor(ratio: int) -> int:
    """``c`` of ``docs/v4_cache.md`` section 2: 2 for the overlapping ratio 4, else 1."""
    return OVERLAP_FACTOR if checked_ratio(ratio) == OVERLAP_RATIO else 1


# ---------------------------------------------------------------- compressor tail


def tail_overlap_rows(ratio: int) -> int:
    """Rows of the previous complete block the tail keeps: 4 for r=4, else 0."""
    return OVERLAP_RATIO if checked_ratio(ratio) == OVERLAP_RATIO else 0


def tail_remainder_rows(prefix_tokens: int, ratio: int) -> int:
    """Rows of the open (incomplete) block: ``P mod r`` for r >= 4, else 0."""
    p, r = as_count("prefix_tokens", prefix_tokens), checked_ratio(ratio)
    return 0 if r <= 1 else p % r


def tail_rows(prefix_tokens: int, ratio: int) -> int:
    """Compressor tail rows needed to resume at P: overlap + remainder rows."""
    return tail_overlap_rows(ratio) + tail_remainder_rows(prefix_tokens, ratio)


def tail_rows_max(ratio: int) -> int:
    """Largest tail over all P: ``overlap + r - 1`` for r >= 4, else 0."""
    r = checked_ratio(ratio)
    return 0 if r <= 1 else tail_overlap_rows(r) + r - 1


def tail_start_token(prefix_tokens: int, ratio: int) -> int:
    """Position of the first tail row: ``P - tail_rows``.

    Negative for r=4 before the first block completes (P < 4): positions below
    0 stand for the padding sentinel rows (a = 0, z = -inf).
    """
    return as_count("prefix_tokens", prefix_tokens) - tail_rows(prefix_tokens, ratio)


def tail_padding_rows(prefix_tokens: int, ratio: int) -> int:
    """Leading tail rows that are the padding sentinel (4 for r=4 and P < 4, else 0)."""
    return max(0, -tail_start_token(prefix_tokens, ratio))


# ------------------------------------------------------------------ sliding window


# ---------------------------------------------------------------- recurrent state


def state_entries(prefix_tokens: int) -> int:
    """Recurrent-state entries needed to resume at P: one (the whole state after token P - 1), none at P = 0,
    where a linear layer starts from its zero state."""
    return min(as_count("prefix_tokens", prefix_tokens), 1)


def state_start_token(prefix_tokens: int) -> int:
    """Where the state a resume at P reads starts: P itself, since it holds exactly the state at P (two resume
    points never share a recurrent state, unlike tails, whose rows at P and P + 1 may start together)."""
    return as_count("prefix_tokens", prefix_tokens)


def window_rows(prefix_tokens: int, window_tokens: int) -> int:
    """Window rows needed to resume at P: ``min(P, W - 1)`` (0 without a window)."""
    p, w = as_count("prefix_tokens", prefix_tokens), as_count("window_tokens", window_tokens)
    return min(p, max(0, w - 1))


def window_rows_max(window_tokens: int) -> int:
    """Largest window over all P: ``W - 1`` (0 without a window)."""
    return max(0, as_count("window_tokens", window_tokens) - 1)


def window_start_token(prefix_tokens: int, window_tokens: int) -> int:
    """First window position at P: ``max(0, P - W + 1)`` (P itself without a window)."""
    return as_count("prefix_tokens", prefix_tokens) - window_rows(prefix_tokens, window_tokens)


# --------------------------------------------------------------------- pages/bytes


def tokens_per_page(entries_per_page: int, ratio: int) -> int:
    """Tokens one page covers; pass ``ratio=1`` (``TOKENS_PER_ROW``) for row pools."""
    return as_count("entries_per_page", entries_per_page, minimum=1) * tokens_per_entry(ratio)


def pages_for_entries(entries: int, entries_per_page: int) -> int:
    """Pages needed to hold ``entries`` entries or rows (ceil division)."""
    n, e = as_count("entries", entries), as_count("entries_per_page", entries_per_page, minimum=1)
    return -(-n // e)


def pages_for_tokens(tokens: int, tokens_per_page: int) -> int:
    """Pages needed to cover ``tokens`` tokens (ceil division)."""
    n, t = as_count("tokens", tokens), as_count("tokens_per_page", tokens_per_page, minimum=1)
    return -(-n // t)


def entries_for_pages(pages: int, entries_per_page: int) -> int:
    """Capacity in entries (or rows) of ``pages`` pages."""
    return as_count("pages", pages) * as_count("entries_per_page", entries_per_page, minimum=1)


def page_index_for_entry(entry_index: int, entries_per_page: int) -> int:
    """Page holding entry (or row) number ``entry_index`` of a pool's sequence."""
    e = as_count("entries_per_page", entries_per_page, minimum=1)
    return as_count("entry_index", entry_index) // e


def bytes_for_entries(entries: int, entry_bytes: int) -> int:
    """Bytes of ``entries`` entries (or rows) of ``entry_bytes`` each."""
    return as_count("entries", entries) * as_count("entry_bytes", entry_bytes, minimum=1)


def aligned_entries_per_page(base_entries: int, entry_bytes: int, alignment_bytes: int) -> int:
    """Smallest multiple of ``base_entries`` whose page bytes are a multiple of the alignment."""
    base = as_count("base_entries", base_entries, minimum=1)
    size = as_count("entry_bytes", entry_bytes, minimum=1)
    align = as_count("alignment_bytes", alignment_bytes, minimum=1)
    entries = base * (align // math.gcd(base * size, align))
    assert (entries * size) % align == 0, (entries, size, align)
    return entries
