"""CacheManager: the object an inference engine's scheduler calls for every request.

    rid = manager.add_request(tokens, cache_salt="tenant-a")
    hit = manager.match(rid)               # longest safe resume point + verdict
    manager.acquire(rid, hit)              # re-check versions (StaleLease), pin
    alloc = manager.allocate(rid, n)       # pages + slot mappings (OutOfPages: nothing changed)
    ...engine writes the KV of n tokens...
    manager.commit(rid, n)                 # publish complete pages and resume points
    manager.release(rid)                   # unpin, free what the request owned

Every public method takes one lock; the manager is safe to share between threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from numpy.typing import ArrayLike

from hkv_core.block_keys import ExtraKeys
from hkv_core.layout import Layout
from hkv_core.manager import admit, alloc, commit, evict, hit, lease, release
from hkv_core.manager.config import ManagerConfig
from hkv_core.manager.core import Core, RequestState
from hkv_core.manager.errors import InvalidRequestState, UnknownRequest
from hkv_core.manager.invariants import InvariantViolation, check_invariants
from hkv_core.manager.records import Allocation, Hit

P = ParamSpec("P")
R = TypeVar("R")


def _locked(method: Callable[P, R]) -> Callable[P, R]:
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        self = args[0]
        assert isinstance(self, CacheManager)
        with self._lock:
            result = method(*args, **kwargs)
            if self.core.config.debug_checks:
                self._assert_invariants(method.__name__)
            return result

    run.__name__, run.__doc__ = method.__name__, method.__doc__
    return run


class CacheManager:
    """Prefix index, hit validation, leases, allocation and eviction over static pools."""

    def __init__(self, layout: Layout, config: ManagerConfig | None = None) -> None:
        self.core = Core(layout, config or ManagerConfig())
        self._lock = threading.RLock()

    @property
    def layout(self) -> Layout:
        return self.core.layout

    @_locked
    def add_request(self, tokens: ArrayLike, *, cache_salt: str | None = None, lora_id: str | int | None = None,
                    mm_keys: tuple[tuple[int, bytes], ...] = ()) -> int:
        """Register a request and hash its prompt; AdmissionRejected past `max_requests`."""
        extra = ExtraKeys(cache_salt=cache_salt, lora_id=lora_id, mm_keys=mm_keys)
        return admit.add_request(self.core, tokens, extra)

    @_locked
    def append_tokens(self, rid: int, tokens: ArrayLike) -> None:
        """Extend a request (decode): new complete blocks get chained keys."""
        admit.append_tokens(self.core, self._request(rid, "append_tokens"), tokens)

    @_locked
    def match(self, rid: int) -> Hit:
        """The longest safe resume point for the request, with the verdict of every layer."""
        req = self._request(rid, "match")
        if req.acquired:
            raise InvalidRequestState(request_id=rid, action="match", reason="already acquired a hit")
        return hit.match(self.core, req)

    @_locked
    def acquire(self, rid: int, found: Hit) -> None:
        """Pin the hit's pages after re-checking their versions (StaleLease if any moved)."""
        req = self._request(rid, "acquire")
        if req.acquired or found.request_id != rid:
            raise InvalidRequestState(request_id=rid, action="acquire",
                                      reason="already acquired" if req.acquired else "hit of another request")
        lease.acquire(self.core, req, found)

    @_locked
    def can_allocate(self, rid: int, num_tokens: int) -> bool:
        """True when `allocate(rid, num_tokens)` would succeed without evicting."""
        req = self._request(rid, "can_allocate")
        counts, _, _ = alloc._needs(self.core, req, req.allocated, req.allocated + num_tokens)
        return all(len(self.core.pools[p].free) >= n for p, n in counts.items())

    @_locked
    def allocate(self, rid: int, num_tokens: int) -> Allocation:
        """Pages and slot mappings for the next tokens; OutOfPages leaves everything as it was."""
        return alloc.allocate(self.core, self._request(rid, "allocate"), num_tokens)

    @_locked
    def commit(self, rid: int, num_tokens: int) -> None:
        """The engine wrote `num_tokens` more tokens: publish what became complete."""
        commit.commit(self.core, self._request(rid, "commit"), num_tokens)

    @_locked
    def release(self, rid: int) -> None:
        """End the request: unpin, free its private pages, forget it."""
        release.release(self.core, self._request(rid, "release"))

    @_locked
    def evict(self, max_units: int | None = None) -> int:
        """Evict unpinned resume points and leaf blocks, LRU first; returns units evicted."""
        return evict.evict_all(self.core, max_units)

    @_locked
    def request_tokens(self, rid: int) -> tuple[int, int, int]:
        """(computed, allocated, known) tokens of a request."""
        req = self._request(rid, "request_tokens")
        return req.computed, req.allocated, len(req.tokens)

    def _request(self, rid: int, action: str) -> RequestState:
        req = self.core.requests.get(rid)
        if req is None:
            raise UnknownRequest(request_id=rid, action=action)
        return req

    def _assert_invariants(self, action: str) -> None:
        broken = check_invariants(self)
        if broken:
            raise InvariantViolation(action=action, violations=broken)
