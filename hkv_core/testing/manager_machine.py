"""A hypothesis state machine that drives a CacheManager like a busy scheduler (zarr-style).

Many requests in flight share a few "system prompts" (with random suffixes
and a random tenant salt) and go through the public API in any order:
add_request, match, acquire (also with a hit matched before an eviction),
allocate (random chunk sizes), complete (copy plans run at once, or kept in
flight for a while, sometimes failing), commit, append_tokens, release,
evict.  The machine keeps its own model of every request (tokens, computed,
allocated, acquired, plans in flight) and of what has been committed; it also
runs speculative steps (hkv_core.testing.draft_rules: propose, something else
meanwhile, accept or reject) and reserves slots ahead of the known tokens
(hkv_core.testing.ahead_rules: allocate_ahead, commit past known refused, the
append that makes them known keeps every page) and checks after every step:

- `check_invariants(manager) == []` (the spec invariants);
- `request_tokens(rid)` of every live request equals the model;
- every hit is shorter than the request's known tokens, never longer than
  the longest committed prefix of the same tenant (docs/failures.md, F10), and
  never shorter than what was committed and retained since the last
  eviction (F7; see `ManagerMachine.usable_at` for what "retained" means);
- failed calls (OutOfPages, StaleLease, InvalidRequestState,
  UnknownRequest, UnknownPlan, AdmissionRejected) change nothing (F3, F8):
  `manager.snapshot()` is equal before and after;
- commit and release refuse a request whose copy plan is in flight, and
  commit one whose copy plan failed;
- a stale hit is refused with the block, resume point or page, the version
  the hit recorded and the version and state found now, and only when one
  of them really moved; a hit whose pages were all unpinned when everything
  was evicted is always stale (layouts with resume points);
- at teardown, completing every plan, releasing everything and evicting
  everything frees every page.

The machine reads the manager through its inspection API (`pages`,
`free_pages`, `pinned`, `owned`, `tables`, `chain`, `snapshot`,
`index_counts`, `stats`) and, to predict staleness, the prefix index's block
and resume-point tables (`core.index.blocks` / `core.index.points`) and the
lease counts of a block's prefix objects (`core.objects.leases`); the live
request ids come from `core.requests.by_rid`.

Bind it with `make_manager_machine(layout_name, block_tokens=..., **config)`;
executors subclass it and override `make_manager` to wrap their own manager.
"""

from __future__ import annotations

import functools
import math
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
    precondition,
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
    UnknownPlan,
    UnknownRequest,
    check_invariants,
)
from hkv_core.manager.lanes import ROLE_OF, managed_pools
from hkv_core.plan import Completion, CopyPages, Plan
from hkv_core.testing.ahead_rules import AheadRules
from hkv_core.testing.draft_rules import DraftRules
from hkv_core.testing.engine_layouts import engine_test_layout
from hkv_core.testing.machine_model import Committed, ModelRequest, evictions

VOCAB_TOKENS = 1000  # token ids drawn in [0, VOCAB_TOKENS)
SALTS: tuple[str | None, ...] = (None, "tenant-a", "tenant-b")
SUFFIX_SEEDS = 4  # few suffixes, so whole prompts repeat too
SUFFIX_STEPS_MAX = 48  # suffix length in eighths of a block
DEFAULT_CONFIG: dict[str, Any] = {"default_pool_pages": 32, "max_requests": 6, "retain_every_blocks": 1,
                                  "key_seed": 0}
# How allocate / commit size a step.  Hypothesis favours small draws, so 0 is the most useful choice.
CHUNK_BLOCK, CHUNK_REST, CHUNK_SCALED, CHUNK_ONE = range(4)
NO_POINT = -1

Snapshot = tuple[Any, ...]


@functools.lru_cache(maxsize=16)
def cached_layout(name: str, block_tokens: int | None) -> Layout:
    """Layouts parse preset files: build each once per process.  `engine:NAME` is an engine-laid-out layout
    of hkv_core.testing.engine_layouts (`engine:NAME:pool_per_group`: each engine group its own pool)."""
    if name.startswith("engine:"):
        _, engine_name, *mode = name.split(":")
        return engine_test_layout(engine_name, pool_per_group=mode == ["pool_per_group"])[0]
    return Layout.from_preset(name, block_tokens=block_tokens)


@attrs.frozen(kw_only=True)
class PrefixGeometry:
    """One prefix pool: tokens per page, compress ratio, entries per page."""

    tokens_per_page: int
    ratio: int
    entries_per_page: int

    def partial(self, boundary: int) -> bool:
        """Does a hit at `boundary` read only part of a page of this pool (a page it must be able to copy)?"""
        return bool((boundary // self.ratio) % self.entries_per_page)


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


def live_requests(manager: CacheManager) -> list[int]:
    """Request ids the manager holds (its request table)."""
    return sorted(manager.core.requests.by_rid)


def _per_pool(found: dict[str, Any]) -> Snapshot:
    return tuple(sorted((name, tuple(sorted(v.items())) if isinstance(v, dict) else tuple(v))
                        for name, v in found.items()))


def pins_snapshot(manager: CacheManager) -> Snapshot:
    """Requests, pins, owners and tables: what no failed call and no eviction may change."""
    out = []
    for rid in live_requests(manager):
        out.append((rid, manager.request_tokens(rid), tuple(manager.chain(rid)), _per_pool(manager.pinned(rid)),
                    _per_pool(manager.owned(rid)), _per_pool(manager.tables(rid))))
    return tuple(out)


class ManagerMachine(DraftRules, AheadRules, RuleBasedStateMachine):
    """Drives one CacheManager; see the module docstring for what it checks."""

    layout_name: ClassVar[str] = "tiny_v4"
    block_tokens_override: ClassVar[int | None] = None
    manager_config: ClassVar[ManagerConfig] = ManagerConfig(**DEFAULT_CONFIG)

    requests: Bundle[int] = Bundle("requests")
    hits: Bundle[Hit] = Bundle("hits")
    plans: Bundle[int] = Bundle("plans")

    def __init__(self) -> None:
        super().__init__()
        self.layout = cached_layout(self.layout_name, self.block_tokens_override)
        self.config = self.manager_config
        self.manager = self.make_manager()
        self.bt = self.layout.block_tokens
        self.model: dict[int, ModelRequest] = {}
        self.released: set[int] = set()
        self.committed: dict[int, Committed] = {}
        self.in_flight: dict[int, tuple[int, Plan]] = {}  # plan id -> (request, plan)
        self.pool_pages = {b.name: b.pages for b in self.manager.bindings()}  # NULL page included
        managed = managed_pools(self.layout, self.config)
        roles = {p.name: ROLE_OF[(p.object_kind, p.entry_kind)] for p in managed}
        self.entries_per_page = {p.name: p.entries_per_page for p in managed}
        self.window_pools = {n for n, r in roles.items() if r is PoolRole.WINDOW}
        prefix = [p for p in managed if roles[p.name] is PoolRole.PREFIX]
        self.prefix = [PrefixGeometry(tokens_per_page=p.tokens_per_page, ratio=max(1, p.compress_ratio),
                                      entries_per_page=p.entries_per_page) for p in prefix]
        self.prefix_page_tokens = [p.tokens_per_page for p in prefix]
        self.lcm_tokens = math.lcm(self.bt, *self.prefix_page_tokens)
        # window pages are shared only whole: a point lies on a boundary of every window page
        self.window_lcm = math.lcm(self.bt, *(p.tokens_per_page for p in managed if p.name in self.window_pools))
        self.needs_points = any(r in (PoolRole.WINDOW, PoolRole.TAIL) for r in roles.values())
        unit = math.lcm(self.bt, self.window_lcm)
        self.hit_unit = unit if self.config.allow_partial_page_copy else math.lcm(unit, self.lcm_tokens)
        self.point_step = math.lcm(self.bt * self.config.retain_every_blocks, self.hit_unit)
        self.system_prompts = self._system_prompts()

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
        after = self.manager.snapshot()
        assert after == before, f"{what} changed the manager's state"

    def _started(self, req: ModelRequest) -> None:
        """The request pins or owns something from now on: later evictions may void what it commits."""
        if req.since is None:
            req.since = evictions(self.manager)

    def _record_commit(self, req: ModelRequest) -> None:
        """Remember the committed prefix; evictions since the request started void its guarantee."""
        assert req.since is not None
        self.committed[req.rid] = Committed(salt=req.salt, tokens=req.tokens[:req.computed].copy(),
                                            start=req.hit_tokens, prompt_tokens=req.prompt_tokens,
                                            evictions=req.since, junction=req.junction)

    def kept(self, done: Committed, boundary: int) -> bool:
        """Did committing `done` keep a resume point at `boundary` (the manager's documented policy)?

        Points are kept at multiples of `retain_every_blocks` blocks, at the
        last boundary a hit can end on (a block, on a boundary of every window
        page, and on multiples of the prefix pages' LCM without partial-page
        copy) at or before the prompt's end and at or before its junction
        (where its last match left the cached chain past the hit).
        """
        if boundary % self.point_step == 0:
            return True
        unit = self.hit_unit
        return ((self.config.retain_prompt_end and boundary == done.prompt_tokens // unit * unit)
                or (self.config.retain_junction and boundary == done.junction // unit * unit)) and boundary > 0

    def usable_at(self, done: Committed, boundary: int) -> bool:
        """Can a hit resume at `boundary` (start < boundary <= committed) from what `done` committed alone?

        - without partial-page copy, only at multiples of the prefix pages' LCM;
        - with window or tail pools, only at a point `done` kept (`kept`);
        - a boundary inside a prefix page reads that page partially: usable only
          once `done` completed the page (published at commit) or released
          (the page it stopped in is sealed and published).
        """
        if not self.config.allow_partial_page_copy and boundary % self.lcm_tokens:
            return False
        if self.needs_points and not self.kept(done, boundary):
            return False
        computed = len(done.tokens)
        return all(done.released or not g.partial(boundary)
                   or computed >= (boundary // g.tokens_per_page + 1) * g.tokens_per_page for g in self.prefix)

    def hit_bounds(self, req: ModelRequest) -> tuple[int, int]:
        """(lowest, highest) hit the request may get from what was committed."""
        bt, top = self.bt, (len(req.tokens) - 1) // self.bt * self.bt if len(req.tokens) else 0
        high = low = 0
        now = evictions(self.manager)
        for done in self.committed.values():
            if done.salt != req.salt:
                continue
            shared = min(_lcp(req.tokens, done.tokens) // bt * bt, top)
            high = max(high, shared)
            if done.evictions != now:
                continue
            for b in range(shared, max(done.start, low), -bt):
                if self.usable_at(done, b):
                    low = b
                    break
        if self.config.accepted_abi is not None or self.config.device_alignment_bytes is not None:
            low = 0  # the hit may be rejected as a whole
        return low, high

    def _check_hit(self, req: ModelRequest, hit: Hit) -> None:
        assert hit.request_id == req.rid
        req.junction = hit.candidate_tokens if hit.candidate_tokens > hit.tokens else 0
        assert hit.tokens % self.bt == 0 and hit.tokens <= hit.candidate_tokens
        assert 0 <= hit.tokens < max(1, len(req.tokens)), f"hit {hit.tokens} of {len(req.tokens)} known tokens"
        low, high = self.hit_bounds(req)
        assert hit.tokens <= high, f"hit {hit.tokens} > {high}, the longest prefix its tenant committed"
        assert hit.tokens >= low, f"hit {hit.tokens} < {low}, committed since the last eviction ({hit.codes})"
        assert set(hit.pages) == set(hit.versions)
        assert (hit.tokens == 0) == (not hit.pages)
        assert len(hit.block_ids) * self.bt == hit.tokens == len(hit.block_versions) * self.bt
        assert not hit.block_ids.flags.writeable and all(not a.flags.writeable for a in hit.pages.values())
        if hit.tokens and self.needs_points:
            assert hit.point != NO_POINT, "a hit on a layout with window or tail pools resumes at no point"
            assert self.kept_anywhere(req, hit.tokens), f"hit {hit.tokens} at a boundary no commit kept a point at"

    def kept_anywhere(self, req: ModelRequest, boundary: int) -> bool:
        """Some request of the tenant committed past `boundary` and may have kept a point there."""
        return any(done.salt == req.salt and done.start < boundary <= _lcp(req.tokens, done.tokens)
                   and self.kept(done, boundary) for done in self.committed.values())

    def _moved(self, hit: Hit) -> bool:
        """Did a block, the resume point or a page of the hit move since it was matched?"""
        index = self.manager.core.index
        blocks, ids = index.blocks, hit.block_ids
        if len(ids) and (np.any(blocks.state[ids] != blocks.s_indexed)
                         or np.any(blocks.version[ids] != hit.block_versions)):
            return True
        if len(ids) and self.needs_points and (int(blocks.point[ids[-1]]) != hit.point
                                               or int(index.points.version[hit.point]) != hit.point_version):
            return True
        for name, pages in hit.pages.items():
            now = self.manager.pages(name, pages)
            if np.any(now.versions != hit.versions[name]) or any(s != "PUBLISHED" for s in now.states):
                return True
        return False

    def _acquire(self, hit: Hit, must_be_stale: bool = False) -> None:
        rid, before = hit.request_id, self.manager.snapshot()
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
            assert stale, f"StaleLease for a hit whose blocks, point and pages did not move: {err}"
            self._check_stale(hit, err)
            self._expect_unchanged(before, "a stale acquire")
            _event(f"acquire: stale lease ({'page' if err.pool in hit.pages else err.pool})")
            return
        assert not stale, "acquire accepted a hit whose blocks, point or page versions moved"
        req.acquired, req.hit_tokens = True, hit.tokens
        req.computed = req.allocated = hit.tokens
        self._started(req)
        pinned = self.manager.pinned(rid)
        for name, pages in hit.pages.items():
            pins = pinned[name]
            assert all(pins.get(int(p)) == int(v) for p, v in zip(pages, hit.versions[name], strict=True)), \
                f"acquire did not pin every {name} page of the hit at the version it recorded"
        assert self.manager.chain(rid) == hit.block_ids.tolist()
        _event(f"acquire: hit {'> 0' if hit.tokens else '= 0'}")

    def _check_stale(self, hit: Hit, err: StaleLease) -> None:
        """The error names a block, the point or a page of the hit, the version the hit recorded, and what
        it has now; something really moved."""
        assert err.request_id == hit.request_id, f"{err}: not about this hit"
        index = self.manager.core.index
        if err.pool == "block":
            blocks = index.blocks
            where = np.flatnonzero(hit.block_ids == err.page)
            assert where.size, f"{err}: block {err.page} is not a block of the hit"
            assert err.expected_version == int(hit.block_versions[where[0]]), \
                f"{err}: the hit recorded version {hit.block_versions[where[0]]}"
            assert err.found_version == int(blocks.version[err.page]), f"{err}: the block has version " \
                                                                       f"{blocks.version[err.page]}"
            found = blocks.table.states[int(blocks.state[err.page])]
            assert (err.expected_state, err.found_state) == ("INDEXED", found), f"{err}: the block is {found}"
        elif err.pool == "resume_point":
            points = index.points
            assert self.needs_points and err.page == hit.point != NO_POINT, f"{err}: the hit resumes at {hit.point}"
            assert err.expected_version == hit.point_version, f"{err}: the hit recorded {hit.point_version}"
            assert err.found_version == int(points.version[err.page]), f"{err}: the point has version " \
                                                                       f"{points.version[err.page]}"
            found = points.table.states[int(points.state[err.page])]
            assert (err.expected_state, err.found_state) == ("KEPT", found), f"{err}: the point is {found}"
            if found == "KEPT" and err.found_version == err.expected_version:
                assert int(index.blocks.point[hit.block_ids[-1]]) != hit.point, f"{err}: the point did not move"
                _event("acquire: stale by point (another point at the block)")
            return
        else:
            assert err.pool in hit.pages, f"{err}: not a pool of this hit"
            where = np.flatnonzero(hit.pages[err.pool] == err.page)
            assert where.size, f"{err}: page {err.page} is not a page of the hit"
            recorded = int(hit.versions[err.pool][where[0]])
            assert err.expected_version == recorded, f"{err}: the hit recorded version {recorded}"
            if err.found_state != "NOT_THIS_HIT":
                now = self.manager.pages(err.pool, [err.page])
                assert err.found_version == int(now.versions[0]), f"{err}: the page has version {now.versions[0]}"
                assert err.found_state == now.states[0], f"{err}: the page is {now.states[0]}"
            assert err.expected_state == "PUBLISHED"
            if err.found_version == err.expected_version:
                _event("acquire: stale by state (page retired, version kept)")
        assert err.found_version != err.expected_version or err.found_state != err.expected_state, \
            f"{err}: neither the version nor the state moved"

    def _complete(self, plan_id: int, ok: bool = True) -> None:
        """An executor ran plan `plan_id` (ok: the copies landed); its targets leave FILLING."""
        rid, plan = self.in_flight.pop(plan_id)
        self.manager.verify(plan)  # the sources are pinned by the request: they cannot have moved
        self.manager.complete(plan_id, Completion(ok=ok))
        for op in plan.ops:
            assert isinstance(op, CopyPages), f"plan {plan_id}: {op!r} is not a copy"
            target = self.manager.pages(op.pool, [op.dst])
            assert target.states[0] != "FILLING" and target.copies[0] == 0, \
                f"plan {plan_id} completed, yet {op.pool} page {op.dst} is {target.states[0]}"
        req = self.model.get(rid)
        if req is not None:
            req.plans.discard(plan_id)
            req.failed |= not ok
        _event(f"complete: {'ok' if ok else 'failed'}")

    def _allocate(self, rid: int, kind: int, scaled: int, hold: bool = False) -> int | None:
        """Allocate a chunk; a refused or failed allocate changes nothing (F8).  Its plan, if any, is
        completed at once, or kept in flight (`hold`): returns its id then."""
        req = self.model[rid]
        room = len(req.tokens) - req.allocated
        n = self._chunk(kind, scaled, room)
        before = self.manager.snapshot()
        try:
            alloc = self.manager.allocate(rid, n)
        except InvalidRequestState:
            assert n > room, f"allocate({n}) with {room} tokens left was refused"
            self._expect_unchanged(before, "a refused allocate")
            _event("allocate: refused")
            return None
        except OutOfPages as err:
            assert n <= room, f"allocate({n}) beyond the {room} tokens left raised OutOfPages, not InvalidRequestState"
            assert err.free < err.needed, f"OutOfPages with {err.free} free of {err.needed} needed"
            self._expect_unchanged(before, "OutOfPages")
            _event("allocate: out of pages")
            return None
        assert n <= room, f"allocate({n}) beyond the {room} tokens left succeeded"
        assert alloc.request_id == rid and alloc.start_tokens == req.allocated and alloc.num_tokens == n
        req.acquired, req.allocated = True, req.allocated + n
        self._started(req)
        self._check_allocation(rid, alloc)
        if alloc.plan is None:
            return None
        plan_id = alloc.plan.plan_id
        assert plan_id not in self.in_flight and alloc.plan.request_id == rid
        self.in_flight[plan_id] = (rid, alloc.plan)
        req.plans.add(plan_id)
        if hold:
            _event("allocate: plan kept in flight")
            return plan_id
        self._complete(plan_id)
        return None

    def _check_allocation(self, rid: int, alloc: Allocation) -> None:
        """New tokens are written only to pages the request owns; copies read pages it pinned into pages it
        owns, FILLING until the plan completes; the plan passes the executor's launch check."""
        owned, pinned = self.manager.owned(rid), self.manager.pinned(rid)
        for name, slots in alloc.slots.items():
            pages = set((slots // self.entries_per_page[name]).tolist())
            assert pages <= set(owned[name]), f"{name}: slots in pages {pages - set(owned[name])} " \
                                              "the request does not own"
            if name in self.window_pools:
                assert len(slots) == alloc.num_tokens, f"{name}: {len(slots)} slots for {alloc.num_tokens} tokens"
        for name, page in alloc.tail_pages.items():
            assert page in owned[name], f"{name}: working tail page {page} not owned"
        for boundary, snaps in alloc.snapshots.items():
            assert boundary % self.bt == 0 and all(p in owned[n] for n, p in snaps.items()), \
                f"snapshot pages at {boundary} not owned"
        for copy in alloc.copies:
            assert copy.dst in owned[copy.pool], f"copy into {copy.pool} page {copy.dst} it does not own"
            assert pinned[copy.pool].get(copy.src) == copy.src_version, "copy from an unpinned page"
            ends = self.manager.pages(copy.pool, [copy.src, copy.dst])
            assert int(ends.versions[0]) == copy.src_version and ends.states == ("PUBLISHED", "FILLING"), \
                f"{copy}: source or target in the wrong state: {ends}"
        if alloc.plan is not None:
            assert alloc.copies, "a plan without copies"
            self.manager.verify(alloc.plan)

    def _must_be_stale(self, hit: Hit) -> bool:
        """Will evicting everything make the hit stale?  With resume points, its point goes unless a lease
        pins the point's tail snapshot or a prefix page of its block: none of those is pinned."""
        if not hit.tokens or not self.needs_points:
            return False
        if any(np.any(self.manager.pages(n, p).leases > 0) for n, p in hit.pages.items()):
            return False
        core = self.manager.core  # the hit's last block's prefix objects (the point's block)
        last = int(hit.block_ids[-1])
        return all(core.objects.leases[int(column[last, 0])] == 0 for _, column in core.index.blocks.refs)

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
        before = self.manager.snapshot()
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
            before = self.manager.snapshot()
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
        must = units is None and self._must_be_stale(hit)
        self.evict(units)
        self._acquire(hit, must_be_stale=must)
        _event(f"match_evict_acquire: hit {'> 0' if hit.tokens else '= 0'}")

    @rule(target=plans, rid=requests, kind=st.integers(0, 3), scaled=st.integers(1, 64), hold=st.booleans())
    def allocate(self, rid: int, kind: int, scaled: int, hold: bool) -> int | MultipleResults[int]:
        """Allocate a chunk; its copy plan is completed at once, or (hold) kept in flight as a bundle."""
        plan_id = self._allocate(rid, kind, scaled, hold)
        return multiple() if plan_id is None else plan_id

    @rule(target=requests, system=st.integers(0, 2), suffix_seed=st.integers(0, SUFFIX_SEEDS - 1),
          suffix_steps=st.integers(0, SUFFIX_STEPS_MAX), salt=st.sampled_from(SALTS), kind=st.integers(0, 3),
          scaled=st.integers(1, 64))
    def follow_up(self, system: int, suffix_seed: int, suffix_steps: int, salt: str | None, kind: int,
                  scaled: int) -> int | MultipleResults[int]:
        """A conversation turn: serve a system prompt, then a longer request over it matches, acquires and
        allocates a first chunk, its copy plan (partial-page copy, tail seed) kept in flight: later commits
        and releases of the request meet it."""
        self.serve_request(system, 0, 0, salt)
        rid = self.add_request(system, suffix_seed, suffix_steps, salt)
        if not isinstance(rid, int):
            return multiple()
        hit = self.match(rid)
        if isinstance(hit, Hit):
            self._acquire(hit)
        if self.model[rid].allocated < len(self.model[rid].tokens):
            self._allocate(rid, kind, scaled, hold=True)
        return rid

    @precondition(lambda self: bool(self.in_flight))
    @rule(ok=st.sampled_from([True, True, False]))
    def complete_oldest(self, ok: bool) -> None:
        """The executor reports the oldest plan in flight."""
        self._complete(min(self.in_flight), ok)

    @rule(plan_id=consumes(plans), ok=st.sampled_from([True, True, False]))
    def complete(self, plan_id: int, ok: bool) -> None:
        """The executor reports a plan kept in flight (a failed one makes its request unable to commit)."""
        if plan_id in self.in_flight:
            self._complete(plan_id, ok)
            return
        before = self.manager.snapshot()  # completed already (its request was released or torn down)
        try:
            self.manager.complete(plan_id, Completion(ok=ok))
        except UnknownPlan:
            self._expect_unchanged(before, "completing a plan twice")
            return
        raise AssertionError(f"plan {plan_id} completed twice")

    @rule(rid=requests, kind=st.integers(0, 3), scaled=st.integers(1, 64))
    def commit(self, rid: int, kind: int, scaled: int) -> None:
        req = self.model[rid]
        room = min(req.allocated, len(req.tokens)) - req.computed  # slots reserved ahead wait for their tokens
        n = self._chunk(kind, scaled, room)
        before = self.manager.snapshot()
        try:
            self.manager.commit(rid, n)
        except InvalidRequestState:
            assert n > room or req.plans or req.failed, f"commit({n}) with {room} allocated tokens left was refused"
            self._expect_unchanged(before, "a refused commit")
            if n <= room:
                _event(f"commit: refused ({'plan in flight' if req.plans else 'plan failed'})")
            return
        assert n <= room, f"commit({n}) beyond the {room} allocated tokens succeeded"
        assert not req.plans, f"commit with copy plans {sorted(req.plans)} in flight succeeded"
        assert not req.failed, "commit after a failed copy plan succeeded"
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
            self._allocate(rid, CHUNK_REST, 1)
        if req.allocated > req.computed:
            self.commit(rid, CHUNK_REST, 1)

    @rule(kind=st.integers(0, 3), scaled=st.integers(1, 64), units=st.sampled_from([1, None, 0]))
    def schedule_step(self, kind: int, scaled: int, units: int | None) -> None:
        """One engine step: evict, then every live request allocates a chunk and commits what it allocated."""
        if units != 0:
            self.evict(units)
        for rid in sorted(self.model):
            if self.model[rid].allocated < len(self.model[rid].tokens):
                self._allocate(rid, kind, scaled)
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
        """Release (refused, changing nothing, while a plan is in flight: then the plans complete first)."""
        req = self.model[rid]
        if req.plans:
            before = self.manager.snapshot()
            try:
                self.manager.release(rid)
            except InvalidRequestState:
                self._expect_unchanged(before, "a refused release")
                _event("release: refused (plan in flight)")
            else:
                raise AssertionError(f"release with copy plans {sorted(req.plans)} in flight succeeded")
            for plan_id in sorted(req.plans):
                self._complete(plan_id)
        self.manager.release(rid)
        del self.model[rid]
        self.released.add(rid)
        if rid in self.committed:
            self.committed[rid] = attrs.evolve(self.committed[rid], released=True)
        for name in self.pool_pages:
            assert rid not in self.manager.pages(name).owners, f"released request {rid} still owns {name} pages"
        try:
            self.manager.request_tokens(rid)
        except UnknownRequest:
            return
        raise AssertionError(f"request {rid} is still known after release")

    @rule(units=st.sampled_from([None, 1, 4, 0]))
    def evict(self, units: int | None) -> None:
        """Evict up to `units` LRU units: never a live request's pins, pages or position."""
        before = pins_snapshot(self.manager)
        count = self.manager.evict(max_units=units)
        assert count >= 0 and (units is None or count <= units), f"evict({units}) evicted {count}"
        assert pins_snapshot(self.manager) == before, "eviction changed a live request or a pin"
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
        assert live_requests(self.manager) == sorted(self.model), "live requests differ from the model"
        for rid, req in self.model.items():
            got = self.manager.request_tokens(rid)
            assert got == (req.computed, req.allocated, len(req.tokens)), \
                f"request {rid}: (computed, allocated, known) {got}, model {req.computed, req.allocated}"
            assert req.hit_tokens <= req.computed <= min(req.allocated, len(req.tokens))
            if not req.acquired:
                self._check_hit(req, self.manager.match(rid))

    def teardown(self) -> None:
        """Complete every plan, release everything, evict everything: every page must come back."""
        if sys.exc_info()[0] is not None:
            return  # a step failed: report that, not what follows from it
        m = self.manager
        for plan_id in sorted(self.in_flight):
            self._complete(plan_id)
        for rid in list(self.model):
            m.release(rid)
        self.model.clear()
        broken = check_invariants(m)
        assert broken == [], "after releasing every request:\n" + "\n".join(broken)
        in_use = 0
        for name, pages in self.pool_pages.items():
            view = m.pages(name)
            assert not np.any(view.leases) and not np.any(view.copies) and all(o is None for o in view.owners), \
                f"{name}: pins or owners left after every request was released"
            used = np.array([s != "FREE" for s in view.states])
            used[0] = False  # the NULL page
            assert np.all(view.holders[used] > 0), f"{name}: pages in use that the index does not hold"
            in_use += int(np.count_nonzero(used))
            if self.config.shared_pages is None:
                assert m.free_pages(name) + int(np.count_nonzero(used)) == pages - 1, \
                    f"{name}: {pages - 1 - m.free_pages(name)} in use, {np.count_nonzero(used)} held by the index"
        if self.config.shared_pages is not None:  # one space: every pool's pages in use and its free ones
            free = m.core.objects.spaces[0].count
            assert free + in_use == self.config.shared_pages, f"shared space: {free} free, {in_use} in use"
        m.evict()
        assert m.index_counts() == {"blocks": 0, "points": 0, "keys": 0}, \
            f"evict() left entries in the index: {m.index_counts()}"
        for name, pages in self.pool_pages.items():
            assert m.free_pages(name) == pages - 1, f"{name}: pages leaked after evicting everything"


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
