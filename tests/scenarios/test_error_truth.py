"""Errors that tell the truth: every refusal names the argument and the value it refused, says what is
true of the state (not what a different path would have done), comes from the HkvError hierarchy, and
leaves the manager exactly as it was."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import attrs
import numpy as np
import pytest

from hkv_core.errors import (
    ConfigError,
    HkvError,
    InvalidArgument,
    InvalidRequestArgument,
    InvalidRequestState,
    InvalidTokens,
    OutOfPages,
    SpecError,
    UnknownPool,
)
from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig
from hkv_core.spec import load_lifecycle
from hkv_core.testing.spec_mutation import mutated_spec
from hkv_exec_ref import RefExecutor
from hkv_exec_ref.engine import Engine
from hkv_exec_ref.tiny_v4 import TinyV4


def tiny(pages: int = 64) -> CacheManager:
    return CacheManager(Layout.from_preset("tiny_v4"), ManagerConfig(default_pool_pages=pages, key_seed=0))


BAD_COUNTS = [0, -1, -5, 2.5, True, "3", None, np.float32(4.0), 10**8, np.uint64(2**64 - 1)]


@pytest.mark.parametrize("value", BAD_COUNTS, ids=repr)
@pytest.mark.parametrize("action", ["allocate", "can_allocate", "commit"])
def test_a_bad_count_names_the_argument_and_the_value(action: str, value: object) -> None:
    m = tiny()
    rid = m.add_request(np.arange(20))
    if action == "commit":
        m.allocate(rid, 10)
    before = m.snapshot()
    with pytest.raises(InvalidRequestArgument) as info:
        getattr(m, action)(rid, value)
    err = info.value
    assert isinstance(err, InvalidRequestState) and isinstance(err, InvalidArgument) and isinstance(err, HkvError)
    assert err.argument == "num_tokens" and err.value is value and err.request_id == rid and err.action == action
    assert f"num_tokens={value!r}" in str(err)
    assert "exceed" not in str(err)
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        room = 10 if action == "commit" else 20
        assert f"[1, {room}]" in err.reason
    else:
        assert "must be an integer" in err.reason
    assert err.fields["argument"] == "num_tokens" and err.fields["request_id"] == rid
    assert m.snapshot() == before


def test_a_count_with_nothing_left_says_so() -> None:
    m = tiny()
    rid = m.add_request(np.arange(20))
    with pytest.raises(InvalidRequestArgument, match=r"num_tokens=1: must be at least 1, and none is left to commit"):
        m.commit(rid, 1)
    m.allocate(rid, 20)
    with pytest.raises(InvalidRequestArgument, match=r"none is left to allocate \(20 tokens known, 20 allocated\)"):
        m.can_allocate(rid, 1)


def test_can_allocate_refuses_what_allocate_refuses_with_the_same_error_and_stays_cheap() -> None:
    m = tiny()
    rid = m.add_request(np.arange(20))
    for value in (-5, 0, 21, 10**8, 2.5):
        with pytest.raises(InvalidRequestArgument) as by_allocate:
            m.allocate(rid, value)
        tracemalloc.start()
        try:
            with pytest.raises(InvalidRequestArgument) as by_can:
                m.can_allocate(rid, value)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 64 << 10, f"can_allocate({value}) allocated {peak} bytes before refusing"
        assert (by_can.value.argument, by_can.value.value, by_can.value.reason) == (
            by_allocate.value.argument, by_allocate.value.value, by_allocate.value.reason)
        assert by_can.value.action == "can_allocate"
    assert m.can_allocate(rid, 20) is True


@pytest.mark.parametrize(("argument", "value", "reason"), [
    ("cache_salt", 5, "must be a str or None"),
    ("lora_id", True, "must be a str, an int or None"),
    ("lora_id", 1.5, "must be a str, an int or None"),
    ("lora_id", 2**64, "must lie in [0, 2**64)"),
    ("lora_id", -1, "must lie in [0, 2**64)"),
    ("mm_keys", "x", "must be a sequence"),
    ("mm_keys", ((-1, b"h"),), "offset must be an int >= 0"),
])
def test_a_bad_extra_key_names_add_requests_argument(argument: str, value: object, reason: str) -> None:
    m = tiny()
    before = m.snapshot()
    with pytest.raises(InvalidArgument) as info:
        m.add_request(np.arange(20), **{argument: value})  # type: ignore[arg-type]
    err = info.value
    assert err.action == "add_request" and err.argument == argument and err.value == value
    assert reason in err.reason and str(err).startswith(f"add_request: {argument}=")
    assert "ExtraKeys" not in str(err)
    assert m.snapshot() == before and m.index_counts()["blocks"] == 0


def test_an_empty_prompt_is_refused_alike_as_a_list_or_an_array() -> None:
    m = tiny()
    before = m.snapshot()
    for empty in ([], np.array([], np.int64), np.zeros(0, np.int32), ()):
        with pytest.raises(InvalidTokens, match="at least one token") as info:
            m.add_request(empty)  # type: ignore[arg-type]
        assert info.value.shape == (0,)
    with pytest.raises(InvalidTokens, match="dtype must be an integer"):
        m.add_request(np.array([]))  # float64: refused for its dtype first
    assert m.snapshot() == before
    rid = m.add_request([1, 2, 3])
    for empty in ([], np.array([], np.int64)):  # extending by nothing is accepted alike (nothing changes)
        m.append_tokens(rid, empty)
    assert m.request_tokens(rid) == (0, 0, 3)


def test_acquire_refuses_a_non_hit_with_a_typed_error() -> None:
    m = tiny()
    rid, other = m.add_request(np.arange(20)), m.add_request(np.arange(20))
    before = m.snapshot()
    for value in (None, 3, "hit"):
        with pytest.raises(InvalidRequestArgument) as info:
            m.acquire(rid, value)  # type: ignore[arg-type]
        assert info.value.argument == "hit" and info.value.value is value
        assert f"got {type(value).__name__}" in info.value.reason
    with pytest.raises(InvalidRequestArgument, match=f"a hit of request {other}, not of request {rid}"):
        m.acquire(rid, m.match(other))
    assert m.snapshot() == before
    m.acquire(rid, m.match(rid))
    with pytest.raises(InvalidRequestState, match="already acquired") as state:
        m.acquire(rid, m.match(other))
    assert not isinstance(state.value, InvalidArgument)


def test_out_of_pages_says_what_is_free_evictable_and_held_and_that_nothing_changed() -> None:
    m = CacheManager(Layout.from_preset("llama_full"), ManagerConfig(default_pool_pages=8, key_seed=1,
                                                                      evict_slack_shift=None))
    block = m.layout.block_tokens
    cached = m.add_request(np.arange(4 * block))  # 4 pages, then released: cached and evictable
    m.allocate(cached, 4 * block)
    m.commit(cached, 4 * block)
    m.release(cached)
    live = m.add_request(np.arange(1000, 1000 + 2 * block))  # 2 pages held by a request in flight
    m.allocate(live, 2 * block)
    rid = m.add_request(np.arange(5000, 5000 + 7 * block))
    before = m.snapshot()
    with pytest.raises(OutOfPages) as info:
        m.allocate(rid, 7 * block)
    err = info.value
    pool = m.bindings()[0].spec.name
    assert (err.pool, err.needed, err.free, err.evictable, err.held, err.capacity) == (pool, 7, 2, 4, 2, 8)
    assert err.free + err.evictable + err.held == err.capacity
    assert "evicted every" not in str(err)
    assert "2 free, eviction could free 4 more, 2 held by requests in flight" in str(err)
    assert "nothing was evicted or changed: retry after requests release" in str(err)
    assert m.snapshot() == before and m.stats["evictions"] == 0
    assert m.can_allocate(rid, 6 * block) is False and m.allocate(rid, 6 * block).num_tokens == 6 * block


def test_out_of_pages_past_the_whole_pool_does_not_advise_waiting() -> None:
    m = CacheManager(Layout.from_preset("llama_full"), ManagerConfig(default_pool_pages=4, key_seed=1))
    rid = m.add_request(np.arange(200))
    with pytest.raises(OutOfPages, match="the pool has 4 in all: allocate fewer tokens at a time") as info:
        m.allocate(rid, 200)
    assert info.value.needed > info.value.capacity == 4 and "retry" not in str(info.value)


def test_pool_pages_naming_no_pool_of_the_layout_is_refused() -> None:
    with pytest.raises(ConfigError, match="no pool 'csa.compresed_kv' in layout 'tiny_v4'") as info:
        CacheManager(Layout.from_preset("tiny_v4"), ManagerConfig(pool_pages={"csa.compresed_kv": 8}))
    assert info.value.key == "pool_pages" and "csa.compressed_kv" in str(info.value)


@pytest.mark.parametrize("pool", ["nope", None, ["csa.swa_window"], 3], ids=repr)
@pytest.mark.parametrize("action", ["pages", "free_pages"])
def test_an_unknown_pool_is_refused_listing_the_known_ones(action: str, pool: object) -> None:
    m = tiny()
    before = m.snapshot()
    with pytest.raises(UnknownPool) as info:  # not an AssertionError (or a TypeError from the lookup)
        getattr(m, action)(pool)
    assert info.value.pool is pool and info.value.action == action
    assert info.value.known == tuple(spec.name for spec in m.layout.pools)
    assert m.snapshot() == before


@pytest.mark.parametrize("which", [[10**9], [65], [-1], "abc", [1.5], [[1]], 3, [True], {1, 2}], ids=repr)
def test_pages_refuses_which_that_is_not_page_ids_of_the_pool(which: object) -> None:
    m = tiny()  # 64 pages and the NULL page: ids 0..64
    with pytest.raises(InvalidArgument) as info:  # not IndexError, ValueError or TypeError from NumPy
        m.pages("csa.swa_window", which)  # type: ignore[arg-type]
    assert (info.value.action, info.value.argument) == ("pages", "which") and info.value.value is which
    assert "[0, 64]" in info.value.reason


def test_pages_takes_lists_ranges_arrays_and_nothing() -> None:
    m = tiny()
    assert m.pages("csa.swa_window", [0, 64]).states == ("FREE", "FREE")
    assert m.pages("csa.swa_window", range(3)).pages.tolist() == [0, 1, 2]
    assert m.pages("csa.swa_window", np.array([5], np.uint8)).pages.tolist() == [5]
    assert m.pages("csa.swa_window", []).states == ()
    assert len(m.pages("csa.swa_window").states) == 65


@pytest.mark.parametrize("plan", [None, "x", 0, [], {"ops": []}], ids=repr)
def test_verify_refuses_what_is_not_a_plan(plan: object) -> None:
    m = tiny()
    with pytest.raises(InvalidArgument) as info:  # not AttributeError: no attribute 'checks'
        m.verify(plan)  # type: ignore[arg-type]
    assert (info.value.action, info.value.argument) == ("verify", "plan") and info.value.value is plan


@pytest.mark.parametrize(("args", "argument"), [
    ((None,), "layout"),
    (("tiny_v4",), "layout"),
    ((Layout.from_preset("tiny_v4"), {"max_requests": 3}), "config"),
    ((Layout.from_preset("tiny_v4"), 3), "config"),
], ids=["None", "a preset name", "a dict config", "an int config"])
def test_cache_manager_refuses_what_is_not_a_layout_or_a_config(args: tuple[object, ...], argument: str) -> None:
    with pytest.raises(InvalidArgument) as info:  # not AttributeError from deep inside the constructor
        CacheManager(*args)  # type: ignore[arg-type]
    assert (info.value.action, info.value.argument) == ("CacheManager", argument)


# ---------------------------------------------------------------------------------------------- the Engine


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.tiny()


@pytest.mark.parametrize(("prompt", "reason"), [
    ([], "at least one token"),
    (np.array([], np.int64), "at least one token"),
    ([1.7, 2.2, 3.9], "dtype must be an integer"),
    (np.array([[1, 2], [3, 4]]), "must be 1-D"),
    ([1, -2, 3], "must lie in [0, 2**31)"),
    ([1, 2, 64], "outside the model's vocabulary of 64"),
])
def test_engine_refuses_a_bad_prompt_with_invalid_tokens(engine: Engine, prompt: object, reason: str) -> None:
    requests = engine.stats.requests
    with pytest.raises(InvalidTokens) as info:
        engine.generate(prompt, 2)  # type: ignore[arg-type]
    assert reason in info.value.reason
    with pytest.raises(InvalidTokens):
        engine.recompute(prompt, 2)  # type: ignore[arg-type]
    assert engine.stats.requests == requests and len(engine.manager.core.requests) == 0


@pytest.mark.parametrize(("kwargs", "argument"), [
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"max_new_tokens": 2.0}, "max_new_tokens"),
    ({"max_new_tokens": 2, "chunk_tokens": 0}, "chunk_tokens"),
])
def test_engine_refuses_bad_counts_with_invalid_argument(engine: Engine, kwargs: dict[str, object],
                                                         argument: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        engine.generate([1, 2, 3], **kwargs)  # type: ignore[arg-type]
    assert info.value.action == "generate" and info.value.argument == argument
    assert len(engine.manager.core.requests) == 0
    with pytest.raises(InvalidArgument, match="evict: tier='disk'"):
        engine.evict("disk")


@pytest.mark.parametrize("action", ["generate", "recompute"])
def test_engine_refuses_more_tokens_than_the_model_has_positions_up_front(engine: Engine, action: str) -> None:
    positions = engine.config.max_positions
    snapshot, passes = engine.manager.snapshot(), engine.stats.forward_passes
    for prompt, new, argument in (([1, 2], 10**12, "max_new_tokens"), ([1, 2], positions, "max_new_tokens"),
                                  ([1] * (positions + 1), 0, "prompt_tokens")):
        with pytest.raises(InvalidArgument) as info:  # not AssertionError from the rope tables, nor OutOfPages
            getattr(engine, action)(prompt, new)
        assert (info.value.action, info.value.argument) == (action, argument)
        assert f"max_positions of {positions}" in info.value.reason
    assert engine.manager.snapshot() == snapshot and engine.stats.forward_passes == passes
    model = TinyV4(attrs.evolve(engine.config, max_positions=40))
    short = Engine(model, CacheManager(engine.layout, engine.manager.config), RefExecutor())
    with pytest.raises(InvalidArgument, match="max_positions of 40"):
        getattr(short, action)([1] * 30, 12)
    assert len(getattr(short, action)([1] * 30, 11).tokens) == 11  # every token but the last new one is forwarded


def test_engine_refuses_more_tokens_than_the_manager_admits_before_admitting() -> None:
    small = Engine.tiny(max_request_tokens=40)
    before = small.manager.snapshot()
    with pytest.raises(InvalidArgument, match="max_request_tokens of 40") as info:
        small.generate([1] * 30, 12)  # 30 + 11 tokens appended to the request
    assert info.value.argument == "max_new_tokens" and small.manager.snapshot() == before
    assert len(small.generate([1] * 30, 11).tokens) == 11 and len(small.recompute([1] * 30, 12).tokens) == 12


def test_engine_serves_integer_prompts_given_as_lists_or_arrays_alike(engine: Engine) -> None:
    a = engine.generate([1, 2, 3, 4, 5], 3)
    b = engine.generate(np.array([1, 2, 3, 4, 5], np.int32), 3)
    assert np.array_equal(a.tokens, b.tokens) and engine.matches_recompute([1, 2, 3, 4, 5], b)


# ---------------------------------------------------------------------------------------------- spec loader


@pytest.mark.parametrize(("old", "new", "kind", "key", "message"), [
    ('initial = "IDLE"', 'initial = "NOWHERE"', "tier_load", "initial",
     "unknown state 'NOWHERE': the initial state must be one of the kind's states (IDLE, "),
    ('initial = "IDLE"', 'initial = "IDLE"\ninital = "IDLE"', "tier_load", "inital", "unknown key"),
    ('{ source = "FREE", event = "reserve", dest = "RESERVED"',
     '{ source = "FREE", event = "reserve", dest = "RESERVED", guard = "x"', "compressed_kv", "guard",
     "unknown key"),
])
def test_a_spec_error_inside_a_kind_names_the_kind(tmp_path: Path, old: str, new: str, kind: str, key: str,
                                                   message: str) -> None:
    with pytest.raises(SpecError) as info:
        load_lifecycle(mutated_spec(tmp_path, old, new))
    err = info.value
    assert err.kind == kind and err.key == key and err.fields["kind"] == kind
    assert f"kind {kind!r}, {key}: " in str(err) and message in str(err)


def test_a_spec_error_outside_the_kinds_names_no_kind(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_lifecycle(mutated_spec(tmp_path, "[meta]\nversion = 2", "[meta]\nversion = 2\nversoin = 2"))
    assert info.value.kind is None and "kind " not in str(info.value)


def test_a_request_id_that_is_not_an_int_is_named_as_such() -> None:
    m = tiny()
    rid = m.add_request(np.arange(20))
    assert rid == 0
    before = m.snapshot()
    for bad in ("0", 0.0, True, None):
        with pytest.raises(InvalidArgument) as info:
            m.match(bad)  # type: ignore[arg-type]
        assert info.value.argument == "rid" and info.value.value is bad
        assert f"got {type(bad).__name__}" in info.value.reason and "unknown request" not in str(info.value)
    with pytest.raises(InvalidArgument, match="rid=True"):
        m.request_tokens(True)  # type: ignore[arg-type]  # not request 1
    assert m.snapshot() == before


def test_acquire_after_allocate_says_allocate_already_started_the_request() -> None:
    m = tiny()
    rid = m.add_request(np.arange(20))
    hit = m.match(rid)
    m.allocate(rid, 8)
    before = m.snapshot()
    for action, call in (("acquire", lambda: m.acquire(rid, hit)), ("match", lambda: m.match(rid))):
        with pytest.raises(InvalidRequestState) as info:
            call()
        assert info.value.action == action
        assert "allocate started the request at token 0 (8 tokens allocated)" in info.value.reason
        assert "before the first allocate" in info.value.reason
    assert m.snapshot() == before


def test_evicting_a_tier_of_a_closed_engine_says_it_is_closed(tmp_path: Path) -> None:
    served = Engine.tiny(disk_dir=tmp_path / "disk", host_bytes=1 << 20)
    served.generate(np.arange(20), 2)
    served.close()
    for tier in ("host", "disk"):
        with pytest.raises(InvalidArgument) as info:
            served.evict(tier)
        assert info.value.argument == "tier" and "closed" in info.value.reason
        assert "has only" not in info.value.reason
    assert served.evict("device") >= 0  # the manager is still there
