"""Operating errors of the cache manager (part of the one HkvError hierarchy)."""

from __future__ import annotations

from hkv_core.errors import HkvError


class StaleLease(HkvError):
    """A hit or lease whose checked pages moved: a new version, or out of the state it was checked in (F3).

    `found_state` names the page's state now and `expected_state` the one the
    hit or plan relied on; a page can leave PUBLISHED (retired from the index
    while another request still pins it) without its version moving.
    """

    def __init__(self, *, pool: str, page: int, expected_version: int, found_version: int,
                 request_id: int, expected_state: str = "PUBLISHED", found_state: str = "PUBLISHED") -> None:
        moved = f"version {found_version}, the hit checked {expected_version}"
        if found_state != expected_state:
            moved += f"; state {found_state}, the hit needs {expected_state}"
        super().__init__(
            f"stale lease for request {request_id}: {pool} page {page} {moved}",
            pool=pool, page=page, expected_version=expected_version, found_version=found_version,
            request_id=request_id, expected_state=expected_state, found_state=found_state)
        self.pool, self.page, self.request_id = pool, page, request_id
        self.expected_version, self.found_version = expected_version, found_version
        self.expected_state, self.found_state = expected_state, found_state


BLOCK_INDEX = "block index"  # StaleLease.pool when a block or resume point of the hit left the index


def stale_block(*, block: int, request_id: int, point: bool) -> StaleLease:
    """StaleLease for a hit whose block (or the resume point at its end) was evicted after match.

    `page` is the arena block id; versions are 0 (blocks carry none); the
    states say what moved: INDEXED -> EVICTED, or POINT -> NO_POINT.
    """
    return StaleLease(pool=BLOCK_INDEX, page=block, expected_version=0, found_version=0, request_id=request_id,
                      expected_state="POINT" if point else "INDEXED", found_state="NO_POINT" if point else "EVICTED")


class AdmissionRejected(HkvError):
    """A request would exceed an admission cap (requests in flight, pages of a pool)."""

    def __init__(self, *, cap: str, limit: int, needed: int, detail: str = "") -> None:
        super().__init__(f"admission rejected: {cap} needs {needed}, limit {limit}. {detail}".strip(),
                         cap=cap, limit=limit, needed=needed)
        self.cap, self.limit, self.needed = cap, limit, needed


class OutOfPages(AdmissionRejected):
    """A pool cannot supply the pages an allocation needs, even after eviction."""

    def __init__(self, *, pool: str, needed: int, free: int) -> None:
        super().__init__(cap=f"pages of pool {pool}", limit=free, needed=needed,
                         detail="evicted every unpinned page; retry after other requests release")
        self.pool, self.free = pool, free
        self.fields.update(pool=pool, free=free)


class UnknownRequest(HkvError):
    """A request id that the manager does not know (released or never created)."""

    def __init__(self, *, request_id: int, action: str) -> None:
        super().__init__(f"{action}: unknown request {request_id} (released or never created)",
                         request_id=request_id, action=action)
        self.request_id, self.action = request_id, action


class InvalidRequestState(HkvError):
    """An API call out of order for this request (e.g. allocate beyond its tokens)."""

    def __init__(self, *, request_id: int, action: str, reason: str) -> None:
        super().__init__(f"{action} on request {request_id}: {reason}",
                         request_id=request_id, action=action, reason=reason)
        self.request_id, self.action, self.reason = request_id, action, reason
