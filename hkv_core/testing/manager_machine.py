"""A hypothesis state machine that drives a CacheManager like a busy scheduler (zarr-style).

Many requests in flight share a few "system prompts" (with random suffixes
and a random tenant salt) and go through the public API in any order:
add_request, match, acquire (also with a hit matched before an eviction),
allocate (random chunk sizes), commit, append_tokens, release, evict.  The
machine keeps its own model of every request (tokens, computed, allocated,
acquired) and of what has been committed, and checks after every step:

- `check_invariants(manager) == []` (the spec invariants);
- `request_tokens(rid)` of every live request equals the model;
- every hit is shorter than the request's known tokens, never longer than
  the longest committed prefix of the same tenant (FAILURES.md F10), and
  never shorter than what was committed since the last eviction (F7);
- failed calls (OutOfPages, StaleLease, InvalidRequestState,
  UnknownRequest, AdmissionRejected) change nothing (F3, F8);
- a stale hit is refused with the page, expected and found version it
  names; a hit whose pages were all unpinned when everything was evicted is
  always stale;
- at teardown, releasing everything and evicting everything frees every page.

Bind it with `make_manager_machine(layout_name, block_tokens=..., **config)`;
executors subclass it and override `make_manager` to wrap their own manager.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, ClassVar, cast

import attrs
import numpy as np
from hypothesis import currently_in_test_context, event, note
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    MultipleResults,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
)
from numpy.typing import NDArray

from hkv_core.layout import Layout
from hkv_core.manager import (
    AdmissionRejected,
    Allocation,
    CacheManager,
    Hit,
    InvalidRequestState,
    ManagerConfig,
    OutOfPages,
    PoolRole,
    StaleLease,
    UnknownRequest,
    check_invariants,
)
from hkv_core.manager.core import Core

VOCAB_TOKENS = 1000  # token ids drawn in [0, VOCAB_TOKENS)
SALTS: tuple[str | None, ...] = (None, "tenant-a", "tenant-b")
SUFFIX_SEEDS = 4  # few suffixes, so whole prompts repeat too
SUFFIX_STEPS_MAX = 48  # suffix length in eighths of a block
DEFAULT_CONFIG: dict[str, Any] = {"default_pool_pages": 32, "max_requests": 6, "retain_every_blocks": 1,
                                  "seed": 0}
# How allocate / commit size a step.  Hypothesis favours small draws, so 0 is the most useful choice.
CHUNK_BLOCK, CHUNK_REST, CHUNK_SCALED, CHUNK_ONE = range(4)

Snapshot = tuple[Any, ...]

@functools.lru_cache(maxsize=16)
def cached_layout(name: str, block_tokens: int | None) -> Layout:
    """Layouts parse preset files: build each once per process."""
    return Layout.from_preset(name, block_tokens=block_tokens)


@attrs.define(kw_only=True)
class ModelRequest:
    """What the machine knows about one live request."""

    rid: int
    salt: str | None
    tokens: NDArray[np.int64]
    prompt_tokens: int
    computed: int = 0
    allocated: int = 0
    hit_tokens: int = 0
    acquired: bool = False


@attrs.frozen(kw_only=True)
class Committed:
    """What one request has committed: tokens [0, len(tokens)) after resuming at `start`."""

    salt: str | None
    tokens: NDArray[np.int64]
    start: int
    prompt_tokens: int
    evictions: int  # the manager's eviction count at the request's first commit


def _lcp(a: NDArray[np.int64], b: NDArray[np.int64]) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def _event(label: str) -> None:
    if currently_in_test_context():  # the machine also runs by hand, when debugging
        event(label)


def _note(text: str) -> None:
    if currently_in_test_context():
        note(text)


def evictions(core: Core) -> int:
    """Units the manager has evicted so far (explicitly or to make room)."""
    return core.stats["evicted_blocks"] + core.stats["evicted_points"]


def request_snapshot(core: Core) -> Snapshot:
    """Every field of every live request."""
    out = []
    for rid in sorted(core.requests):
        r = core.requests[rid]
        out.append((rid, r.computed, r.allocated, r.tokens.tobytes(), r.hit_tokens,
                    r.acquired, tuple(r.chain),
                    tuple(tuple(t) for t in r.tables), tuple(tuple(sorted(o)) for o in r.owned),
                    tuple(tuple(sorted(p.items())) for p in r.pinned_versions),
                    tuple(sorted((b, tuple(p)) for b, p in r.snapshots.items()))))
    return tuple(out)


def pins_snapshot(core: Core) -> Snapshot:
    """Requests, pins and owners: what no failed call and no eviction may change."""
    pools = tuple((p.leases.tobytes(), p.copies.tobytes(), p.owner.tobytes()) for p in core.pools)
    return request_snapshot(core), pools


def full_snapshot(core: Core) -> Snapshot:
    """Everything but the clock: pools, free lists, prefix index, requests."""
    a = core.arena
    pools = tuple((tuple(p.free), p.state.tobytes(), p.version.tobytes(), p.holders.tobytes(),
                   p.frozen.tobytes()) for p in core.pools)
    queue = a.lru_block[a.lru_head:a.lru_len][a.current(a.lru_head, a.lru_len)]  # the LRU order, stale entries aside
    index = tuple(x.tobytes() for x in (queue, a.alive, a.point, a.parent, a.children, a.prefix_pages,
                                        a.window_pages, a.tail_pages))
    return pins_snapshot(core), pools, index, core.keys.count, tuple(sorted(core.stats.items()))


class ManagerMachine(RuleBasedStateMachine):
    """Drives one CacheManager; see the module docstring for what it checks."""

    layout_name: ClassVar[str] = "tiny_v4"
    block_tokens_override: ClassVar[int | None] = None
    manager_config: ClassVar[ManagerConfig] = ManagerConfig(**DEFAULT_CONFIG)

    requests: Bundle[int] = Bundle("requests")
    hits: Bundle[Hit] = Bundle("hits")

    def __init__(self) -> None:
        super().__init__()
        self.layout = cached_layout(self.layout_name, self.block_tokens_override)
        self.config = self.manager_config
        self.manager = self.make_manager()
        self.core: Core = self.manager.core
        self.bt = self.layout.block_tokens
        self.model: dict[int, ModelRequest] = {}
        self.released: set[int] = set()
        self.committed: dict[int, Committed] = {}
        infos = self.core.infos
        self.prefix_page_tokens = [i.spec.tokens_per_page for i in infos if i.role is PoolRole.PREFIX]
        self.system_prompts = self._system_prompts()
        self.has_tails = any(i.role is PoolRole.TAIL for i in infos)
        self.needs_points = any(i.role is not PoolRole.PREFIX for i in infos)

    def make_manager(self) -> CacheManager:
        """The manager under test (override to wrap or break it)."""
        return CacheManager(self.layout, self.config)

    def _system_prompts(self) -> list[NDArray[np.int64]]:
        """Shared prompt heads: one spans the largest prefix page, others share part of it or extend it."""
        bt = self.bt
        unit = max(4 * bt, *self.prefix_page_tokens)
        root = np.random.default_rng(7).integers(0, VOCAB_TOKENS, 2 * unit + 4 * bt)
        other = np.random.default_rng(8).integers(0, VOCAB_TOKENS, 2 * unit + 4 * bt)
        head = root[:unit + 2 * bt]
        return [head, np.concatenate([head, other[:bt]]),
                np.concatenate([root[:unit // 2], other[:unit // 2 + bt + bt // 2]]), np.zeros(0, np.int64)]

    # ---------------------------------------------------------------- helpers

    def _chunk(self, kind: int, scaled: int, room: int) -> int:
        """A step size: one token, up to the next block boundary, everything left, or any (may overshoot)."""
        if kind == CHUNK_ONE:
            return 1
        if kind == CHUNK_BLOCK:
            return max(1, min(room, self.bt))
        if kind == CHUNK_REST:
            return max(1, room)
        return max(1, scaled * self.bt // 8)

    def _expect_unchanged(self, before: Snapshot, what: str) -> None:
        after = full_snapshot(self.core)
        assert after == before, f"{what} changed the manager's state"

    def _record_commit(self, req: ModelRequest) -> None:
        """Remember the committed prefix; only evictions since the request's first commit void its guarantee."""
        first = self.committed.get(req.rid)
        self.committed[req.rid] = Committed(salt=req.salt, tokens=req.tokens[:req.computed].copy(),
                                            start=req.hit_tokens, prompt_tokens=req.prompt_tokens,
                                            evictions=evictions(self.core) if first is None else first.evictions)

    def _retained(self, done: Committed, boundary: int) -> bool:
        """Did committing `done` keep a resume point at `boundary` (the manager's documented policy)?"""
        if not self.needs_points:
            return True
        blocks = boundary // self.bt
        prompt_end = done.prompt_tokens // self.bt * self.bt
        return blocks % self.config.retain_every_blocks == 0 or (self.config.retain_prompt_end
                                                                 and boundary == prompt_end)

    def hit_bounds(self, req: ModelRequest) -> tuple[int, int]:
        """(lowest, highest) hit the request may get from what was committed."""
        bt, top = self.bt, (len(req.tokens) - 1) // self.bt * self.bt if len(req.tokens) else 0
        high = low = 0
        lcm = self.core.lcm_tokens
        for done in self.committed.values():
            if done.salt != req.salt:
                continue
            shared = min(_lcp(req.tokens, done.tokens) // bt * bt, top)
            high = max(high, shared)
            if done.evictions != evictions(self.core):
                continue
            cap = min([shared] + [len(done.tokens) // t * t for t in self.prefix_page_tokens])
            for b in range(cap, done.start, -bt):
                if self._retained(done, b) and (self.config.allow_partial_page_copy or b % lcm == 0):
                    low = max(low, b)
                    break
        if self.config.accepted_abi is not None or self.config.device_alignment_bytes is not None:
            low = 0  # the hit may be rejected as a whole
        return low, high

    def _check_hit(self, req: ModelRequest, hit: Hit) -> None:
        assert hit.request_id == req.rid
        assert hit.tokens % self.bt == 0 and hit.tokens <= hit.candidate_tokens
        assert 0 <= hit.tokens < max(1, len(req.tokens)), f"hit {hit.tokens} of {len(req.tokens)} known tokens"
        low, high = self.hit_bounds(req)
        assert hit.tokens <= high, f"hit {hit.tokens} > {high}, the longest prefix its tenant committed"
        assert hit.tokens >= low, f"hit {hit.tokens} < {low}, committed since the last eviction ({hit.codes})"
        assert set(hit.pages) == set(hit.versions)
        assert (hit.tokens == 0) == (not hit.pages)

    def _moved(self, hit: Hit) -> bool:
        """Did any page of the hit change version or leave PUBLISHED since it was matched?"""
        for name, pages in hit.pages.items():
            pool = self.core.pools[self.core.pool_index[name]]
            if np.any(pool.version[pages] != hit.versions[name]) or np.any(pool.state[pages] != pool.published):
                return True
        return False

    def _acquire(self, hit: Hit, must_be_stale: bool = False) -> None:
        rid, before = hit.request_id, full_snapshot(self.core)
        req = self.model.get(rid)
        if req is None or req.acquired:
            expected: type[Exception] = UnknownRequest if req is None else InvalidRequestState
            try:
                self.manager.acquire(rid, hit)
            except expected:
                self._expect_unchanged(before, f"a refused acquire ({expected.__name__})")
                return
            raise AssertionError(f"acquire of request {rid} should raise {expected.__name__}")
        stale = self._moved(hit)
        assert stale or not must_be_stale, "every page of the hit was unpinned and evicted, yet it is not stale"
        try:
            self.manager.acquire(rid, hit)
        except StaleLease as err:
            assert stale, f"StaleLease for a hit whose pages did not move: {err}"
            self._check_stale(hit, err)
            self._expect_unchanged(before, "a stale acquire")
            _event("acquire: stale lease")
            return
        assert not stale, "acquire accepted a hit whose page versions moved"
        req.acquired, req.hit_tokens = True, hit.tokens
        req.computed = req.allocated = hit.tokens
        state = self.core.requests[rid]
        for name, pages in hit.pages.items():
            pins = state.pinned_versions[self.core.pool_index[name]]
            assert all(int(p) in pins for p in pages), f"acquire did not pin every {name} page of the hit"
        _event(f"acquire: hit {'> 0' if hit.tokens else '= 0'}")

    def _check_stale(self, hit: Hit, err: StaleLease) -> None:
        """The error names a page of the hit, the version the hit recorded, and what the page has now."""
        assert err.request_id == hit.request_id and err.pool in hit.pages, f"{err}: not about this hit"
        where = np.flatnonzero(hit.pages[err.pool] == err.page)
        assert where.size, f"{err}: page {err.page} is not a page of the hit"
        recorded = int(hit.versions[err.pool][where[0]])
        assert err.expected_version == recorded, f"{err}: the hit recorded version {recorded}"
        pool = self.core.pools[self.core.pool_index[err.pool]]
        assert err.found_version == int(pool.version[err.page]), f"{err}: the page has version {pool.version[err.page]}"
        assert err.found_state == pool.state_name(err.page), f"{err}: the page is {pool.state_name(err.page)}"
        if err.found_version == err.expected_version:
            assert err.found_state != "PUBLISHED", f"{err}: neither the version nor the state moved"
            _event("acquire: stale by state (page retired, version kept)")

    # ------------------------------------------------------------------ rules

    @initialize(cold=st.integers(0, 2), salt=st.sampled_from(SALTS))
    def warm_up(self, cold: int, salt: str | None) -> None:
        """Start with 2 - cold system prompts already served (and released) for one tenant."""
        for system in range(2 - cold):
            self.serve_request(system, 0, 0, salt)

    @rule(target=requests, system=st.integers(0, 3), suffix_seed=st.integers(0, SUFFIX_SEEDS - 1),
          suffix_steps=st.integers(0, SUFFIX_STEPS_MAX), salt=st.sampled_from(SALTS))
    def add_request(self, system: int, suffix_seed: int, suffix_steps: int,
                    salt: str | None) -> int | MultipleResults[int]:
        suffix = np.random.default_rng(100 + suffix_seed).integers(0, VOCAB_TOKENS, suffix_steps * self.bt // 8)
        tokens = np.concatenate([self.system_prompts[system], suffix]).astype(np.int64)
        if not len(tokens):
            tokens = np.array([suffix_seed], np.int64)
        before = full_snapshot(self.core)
        if len(self.model) >= self.config.max_requests:
            try:
                self.manager.add_request(tokens, cache_salt=salt)
            except AdmissionRejected as err:
                assert not isinstance(err, OutOfPages)
                self._expect_unchanged(before, "a rejected add_request")
                _event("add_request: admission rejected")
                return multiple()
            raise AssertionError("add_request past max_requests was admitted")
        rid = self.manager.add_request(tokens, cache_salt=salt)
        assert rid not in self.model and rid not in self.released, f"request id {rid} reused"
        self.model[rid] = ModelRequest(rid=rid, salt=salt, tokens=tokens, prompt_tokens=len(tokens))
        _note(f"request {rid}: system {system}, {len(tokens)} tokens, salt {salt}")
        return rid

    @rule(target=hits, rid=requests)
    def match(self, rid: int) -> Hit | MultipleResults[Hit]:
        req = self.model[rid]
        if req.acquired:
            before = full_snapshot(self.core)
            try:
                self.manager.match(rid)
            except InvalidRequestState:
                self._expect_unchanged(before, "a refused match")
                return multiple()
            raise AssertionError(f"match of acquired request {rid} should raise InvalidRequestState")
        hit = self.manager.match(rid)
        self._check_hit(req, hit)
        return hit

    @rule(hit=consumes(hits))
    def acquire(self, hit: Hit) -> None:
        """Acquire a hit matched some steps ago: other requests may have evicted its pages since."""
        self._acquire(hit)

    @rule(rid=requests, units=st.sampled_from([None, 1, 4]))
    def match_evict_acquire(self, rid: int, units: int | None) -> None:
        """Match, let another request's eviction run, then acquire the now maybe stale hit."""
        req = self.model[rid]
        if req.acquired:
            return
        hit = self.manager.match(rid)
        self._check_hit(req, hit)
        unpinned = all(not np.any(self.core.pools[self.core.pool_index[n]].leases[p] > 0)
                       for n, p in hit.pages.items())
        self.evict(units)
        self._acquire(hit, must_be_stale=bool(units is None and hit.tokens and unpinned and self.has_tails))
        _event(f"match_evict_acquire: hit {'> 0' if hit.tokens else '= 0'}")

    @rule(rid=requests, kind=st.integers(0, 3), scaled=st.integers(1, 64))
    def allocate(self, rid: int, kind: int, scaled: int) -> None:
        """Allocate a chunk; a refused or failed allocate changes nothing (F8)."""
        req = self.model[rid]
        room = len(req.tokens) - req.allocated
        n = self._chunk(kind, scaled, room)
        before, pins_before = full_snapshot(self.core), pins_snapshot(self.core)
        evicted = evictions(self.core)
        try:
            alloc = self.manager.allocate(rid, n)
        except InvalidRequestState:
            assert n > room, f"allocate({n}) with {room} tokens left was refused"
            self._expect_unchanged(before, "a refused allocate")
            _event("allocate: refused")
            return
        except OutOfPages as err:
            assert n <= room, f"allocate({n}) beyond the {room} tokens left raised OutOfPages, not InvalidRequestState"
            assert err.free < err.needed, f"OutOfPages with {err.free} free of {err.needed} needed"
            assert pins_snapshot(self.core) == pins_before, "OutOfPages changed requests, pins or owners"
            if evictions(self.core) == evicted:
                self._expect_unchanged(before, "OutOfPages (nothing evicted)")
            _event("allocate: out of pages")
            return
        assert n <= room, f"allocate({n}) beyond the {room} tokens left succeeded"
        assert alloc.request_id == rid and alloc.start_tokens == req.allocated and alloc.num_tokens == n
        self._check_allocation(rid, alloc)
        req.acquired, req.allocated = True, req.allocated + n

    def _check_allocation(self, rid: int, alloc: Allocation) -> None:
        """New tokens are written only to pages the request owns; copies read pages it pinned."""
        state = self.core.requests[rid]
        for name, slots in alloc.slots.items():
            info = self.core.infos[self.core.pool_index[name]]
            pages = set((slots // info.spec.entries_per_page).tolist())
            assert pages <= state.owned[info.index], f"{name}: slots in pages {pages - state.owned[info.index]} " \
                                                     "the request does not own"
            if info.role is PoolRole.WINDOW:
                assert len(slots) == alloc.num_tokens, f"{name}: {len(slots)} slots for {alloc.num_tokens} tokens"
        for copy in alloc.copies:
            index = self.core.pool_index[copy.pool]
            assert copy.dst in state.owned[index], f"copy into {copy.pool} page {copy.dst} it does not own"
            assert state.pinned_versions[index].get(copy.src) == copy.src_version, "copy from an unpinned page"
            assert int(self.core.pools[index].version[copy.src]) == copy.src_version

    @rule(rid=requests, kind=st.integers(0, 3), scaled=st.integers(1, 64))
    def commit(self, rid: int, kind: int, scaled: int) -> None:
        req = self.model[rid]
        room = req.allocated - req.computed
        n = self._chunk(kind, scaled, room)
        before = full_snapshot(self.core)
        try:
            self.manager.commit(rid, n)
        except InvalidRequestState:
            assert n > room, f"commit({n}) with {room} allocated tokens left was refused"
            self._expect_unchanged(before, "a refused commit")
            return
        assert n <= room, f"commit({n}) beyond the {room} allocated tokens succeeded"
        req.computed += n
        self._record_commit(req)

    @rule(system=st.integers(0, 3), suffix_seed=st.integers(0, SUFFIX_SEEDS - 1),
          suffix_steps=st.integers(0, SUFFIX_STEPS_MAX), salt=st.sampled_from(SALTS))
    def serve_request(self, system: int, suffix_seed: int, suffix_steps: int, salt: str | None) -> None:
        """A whole short request (add, match, acquire, prefill, release): fills the cache, keeps no pins."""
        rid = self.add_request(system, suffix_seed, suffix_steps, salt)
        if not isinstance(rid, int):
            return
        hit = self.match(rid)
        if isinstance(hit, Hit):
            self._acquire(hit)
        self.prefill(rid)
        self.release(rid)

    @rule(rid=requests)
    def prefill(self, rid: int) -> None:
        """Allocate and commit everything left (a whole prefill step)."""
        req = self.model[rid]
        room = len(req.tokens) - req.allocated
        if room:
            self.allocate(rid, CHUNK_REST, 1)
        if req.allocated > req.computed:
            self.commit(rid, CHUNK_REST, 1)

    @rule(kind=st.integers(0, 3), scaled=st.integers(1, 64), units=st.sampled_from([1, None, 0]))
    def schedule_step(self, kind: int, scaled: int, units: int | None) -> None:
        """One engine step: evict, then every live request allocates a chunk and commits what it allocated."""
        if units != 0:
            self.evict(units)
        for rid in sorted(self.model):
            if self.model[rid].allocated < len(self.model[rid].tokens):
                self.allocate(rid, kind, scaled)
            if self.model[rid].allocated > self.model[rid].computed:
                self.commit(rid, CHUNK_REST, 1)

    @rule(rid=requests, count=st.integers(1, 3), seed=st.integers(0, 3))
    def append_tokens(self, rid: int, count: int, seed: int) -> None:
        """Decode: the request grows by a few tokens."""
        req = self.model[rid]
        more = np.random.default_rng(200 + seed).integers(0, VOCAB_TOKENS, count)
        self.manager.append_tokens(rid, more)
        req.tokens = np.concatenate([req.tokens, more]).astype(np.int64)

    @rule(rid=consumes(requests))
    def release(self, rid: int) -> None:
        self.manager.release(rid)
        del self.model[rid]
        self.released.add(rid)
        for pool in self.core.pools:
            assert not np.any(pool.owner == rid), "a released request still owns pages"
        try:
            self.manager.request_tokens(rid)
        except UnknownRequest:
            return
        raise AssertionError(f"request {rid} is still known after release")

    @rule(units=st.sampled_from([None, 1, 4, 0]))
    def evict(self, units: int | None) -> None:
        """Evict up to `units` LRU units: never a live request's pins, pages or position."""
        before = pins_snapshot(self.core)
        count = self.manager.evict(max_units=units)
        assert count >= 0 and (units is None or count <= units), f"evict({units}) evicted {count}"
        assert pins_snapshot(self.core) == before, "eviction changed a live request or a pin"
        if count:
            _event("evict: evicted something")

    # ------------------------------------------------------------- invariants

    @invariant()
    def state_is_consistent(self) -> None:
        """After every step: the spec invariants, then the model."""
        broken = check_invariants(self.manager)
        assert broken == [], "invariant violated:\n" + "\n".join(broken)
        self._requests_match_model()

    def _requests_match_model(self) -> None:
        assert set(self.core.requests) == set(self.model), "live requests differ from the model"
        for rid, req in self.model.items():
            got = self.manager.request_tokens(rid)
            assert got == (req.computed, req.allocated, len(req.tokens)), \
                f"request {rid}: (computed, allocated, known) {got}, model {req.computed, req.allocated}"
            assert req.hit_tokens <= req.computed <= req.allocated <= len(req.tokens)
            if not req.acquired:
                self._check_hit(req, self.manager.match(rid))

    def teardown(self) -> None:
        """Release everything, evict everything: every page must come back."""
        if sys.exc_info()[0] is not None:
            return  # a step failed: report that, not what follows from it
        for rid in list(self.model):
            self.manager.release(rid)
        self.model.clear()
        broken = check_invariants(self.manager)
        assert broken == [], "after releasing every request:\n" + "\n".join(broken)
        for info, pool in zip(self.core.infos, self.core.pools, strict=True):
            assert not np.any(pool.leases) and not np.any(pool.copies) and not np.any(pool.owner >= 0), \
                f"{info.name}: pins or owners left after every request was released"
            held = int(np.count_nonzero(pool.holders))
            assert len(pool.free) + held == info.pages - 1, f"{info.name}: {info.pages - 1 - len(pool.free)} " \
                                                            f"pages in use, {held} held by the index"
        self.manager.evict()
        assert self.core.arena.live == 0 and self.core.keys.count == 0, "evict() left blocks in the index"
        for info, pool in zip(self.core.infos, self.core.pools, strict=True):
            assert len(pool.free) == info.pages - 1, f"{info.name}: pages leaked after evicting everything"


def make_manager_machine(layout_name: str, *, block_tokens: int | None = None,
                         **config: Any) -> type[ManagerMachine]:
    """A ManagerMachine bound to a preset layout and ManagerConfig fields (defaults: DEFAULT_CONFIG)."""
    manager_config = ManagerConfig(**{**DEFAULT_CONFIG, **config})
    cached_layout(layout_name, block_tokens)  # fail here, not in the first example, on a bad name
    label = "_".join([layout_name, *(f"{k}{v}" for k, v in sorted(config.items()))])
    bound = type(f"ManagerMachine_{label}", (ManagerMachine,),
                 {"layout_name": layout_name, "block_tokens_override": block_tokens,
                  "manager_config": manager_config})
    return cast(type[ManagerMachine], bound)
