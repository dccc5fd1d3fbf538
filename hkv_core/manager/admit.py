"""Admission: register a request (hashing its prompt) and extend it while decoding."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from hkv_core.block_keys import ExtraKeys, checked_tokens
from hkv_core.manager.core import Core, RequestState
from hkv_core.manager.errors import AdmissionRejected
from hkv_core.manager.id_list import IdList


def add_request(core: Core, tokens: ArrayLike, extra: ExtraKeys) -> int:
    """A new request id; AdmissionRejected past `max_requests`, InvalidTokens for bad arrays."""
    if len(core.requests) >= core.config.max_requests:
        raise AdmissionRejected(cap="requests in flight", limit=core.config.max_requests,
                                needed=len(core.requests) + 1, detail="wait for a release")
    array = np.asarray(tokens)
    keys = core.hasher.hash_blocks(array, extra)  # validates the token array first (InvalidTokens)
    rid, n_pools = core.next_rid, len(core.infos)
    core.requests[rid] = RequestState(
        rid=rid, tokens=array.astype(np.int64), keys=keys, extra=extra, prompt_tokens=len(array),
        pinned_versions=[{} for _ in range(n_pools)], tables=[IdList() for _ in range(n_pools)],
        owned=[set() for _ in range(n_pools)])
    core.next_rid += 1
    return rid


def append_tokens(core: Core, req: RequestState, tokens: ArrayLike) -> None:
    """Extend a request (decode); new complete blocks get keys chained to the last one."""
    more = checked_tokens(np.asarray(tokens)).astype(np.int64)  # InvalidTokens before anything changes
    done = len(req.keys) * core.block_tokens
    open_block = np.concatenate([req.tokens[done:], more])  # the tokens after the last complete block
    parent = req.keys[-1].astype("<u8").tobytes() if len(req.keys) else None
    keys = core.hasher.hash_blocks(open_block, req.extra, parent=parent, start_block=len(req.keys))
    req.extend(more, keys)
