"""Admission: register a request (hashing its prompt) and extend it while decoding."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from hkv_core.block_keys import ExtraKeys, checked_tokens
from hkv_core.errors import AdmissionRejected, InvalidTokens
from hkv_core.manager.allocate import verify_known
from hkv_core.manager.core import Core
from hkv_core.manager.requests import RequestState


def as_token_array(tokens: ArrayLike) -> np.ndarray:
    """`tokens` as an array.  A list (or tuple) of ints is packed straight into a new int64 array in one C loop
    (`struct.pack_into`, about twice as fast as `array('q')` and, like it, refusing floats rather than
    truncating them), an empty one included; anything else as NumPy infers it (a float list stays float:
    InvalidTokens later).  A bool in a list is InvalidTokens, as a bool array is (`pack_into` takes it as 0 / 1)."""
    if isinstance(tokens, list | tuple):
        out = np.empty(len(tokens), np.int64)
        try:
            struct.pack_into(f"={len(tokens)}q", out.data, 0, *tokens)
        except struct.error:  # not all ints in range: the inferred array says what is wrong
            inferred = np.asarray(tokens)
            if inferred.dtype.kind in "iu":  # ints and NumPy bools mixed: NumPy made ints of the bools
                _refuse_bools(tokens, range(len(tokens)))
            return inferred
        _refuse_bools(tokens, np.flatnonzero(out.view(np.uint64) <= 1))  # only a 0 or a 1 can have been a bool
        return out
    return np.asarray(tokens)


def _refuse_bools(tokens: list[Any] | tuple[Any, ...], where: Iterable[int]) -> None:
    """InvalidTokens if `tokens` holds a bool at one of the indices `where`."""
    for i in where:
        if isinstance(tokens[i], bool | np.bool_):
            raise InvalidTokens(f"token ids must be integers, got a bool at index {i}: {tokens[i]!r}",
                                dtype=None, shape=None)


def add_request(core: Core, tokens: ArrayLike, extra: ExtraKeys) -> int:
    """A new request id; AdmissionRejected past `max_requests` or `max_request_tokens`, InvalidTokens for bad arrays
    and for an empty prompt (a list or an array alike: a request computes at least one token)."""
    if len(core.requests) >= core.config.max_requests:
        raise AdmissionRejected(cap="requests in flight", limit=core.config.max_requests,
                                needed=len(core.requests) + 1, detail="wait for a release")
    array = as_token_array(tokens)
    check_length(core, array.shape[0] if array.ndim else 1)
    keys = core.hasher.hash_blocks(array, extra)  # validates the token array first (InvalidTokens)
    if not len(array):
        raise InvalidTokens("a prompt needs at least one token (a request computes at least one)",
                            dtype=str(array.dtype), shape=tuple(array.shape))
    owned = array.astype(np.int64, copy=not isinstance(tokens, list | tuple))  # a list's new array is already ours
    req = core.requests.admit(RequestState, tokens=owned, keys=keys, extra=extra,
                              prompt_tokens=len(array), lanes=len(core.pools))
    return req.rid


def append_tokens(core: Core, req: RequestState, tokens: ArrayLike) -> None:
    """Extend a request (decode); new complete blocks get keys chained to the last one; slots reserved ahead
    that the tokens make known are verified (they keep their pages)."""
    more = checked_tokens(as_token_array(tokens)).astype(np.int64)  # InvalidTokens before anything changes
    check_length(core, len(req.tokens) + len(more))
    done = len(req.keys) * core.block_tokens
    if len(req.tokens) + len(more) - done < core.block_tokens:  # no block completes: no key to compute
        req.extend(more, req.keys[:0])
    else:
        open_block = np.concatenate([req.tokens[done:], more])  # the tokens after the last complete block
        parent = req.keys[-1].astype("<u8").tobytes() if len(req.keys) else None
        keys = core.hasher.hash_blocks(open_block, req.extra, parent=parent, start_block=len(req.keys))
        req.extend(more, keys)
    core.requests.set_known(req)
    verify_known(core, req)  # slots reserved ahead that these tokens make known


def check_length(core: Core, tokens: int) -> None:
    if tokens > core.config.max_request_tokens:
        raise AdmissionRejected(cap="tokens per request", limit=core.config.max_request_tokens, needed=tokens,
                                detail="raise ManagerConfig.max_request_tokens")
