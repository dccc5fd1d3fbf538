"""A KV connector's tokens through hkv_vllm: allocated like computed tokens, published only once vLLM reports
them written (docs/vllm.md, "KV connectors")."""

import pytest

from tests.vllm_plugin.conftest import HAS_VLLM, SKIP_REASON
from tests.vllm_plugin.test_adapter import manager, serve

pytestmark = pytest.mark.skipif(not HAS_VLLM, reason=SKIP_REASON)

PROMPT = list(range(80))  # five blocks


def probe(m, name="probe"):
    """The hit another request with the same prompt (and one more token) gets now."""
    from hkv_vllm.drive import make_request

    request = make_request(name, PROMPT + [1], max_tokens=1)
    hit = m.get_computed_blocks(request)[1]
    m.free(request)
    return hit


def start_load(m, *, local=0, external=64, delay=True):
    """A request whose first `local` tokens are hkv's hit and the next `external` a connector's, as vLLM's
    scheduler allocates it: an async load (`delay`) schedules nothing else, and counts the loaded tokens
    computed at once."""
    from hkv_vllm.drive import make_request

    request = make_request("loading", PROMPT, max_tokens=1)
    blocks, hit, _ = m.get_computed_blocks(request)
    assert hit == local
    rest = 0 if delay else len(PROMPT) - local - external
    got = m.allocate_slots(request, rest, hit, blocks, num_external_computed_tokens=external,
                           delay_cache_blocks=delay)
    assert got is not None
    request.num_computed_tokens = local + external
    return request


def test_an_async_load_is_no_hit_until_vllm_reports_it_done():
    m = manager()
    request = start_load(m)
    assert len(m.get_block_ids("loading")[0]) == 4  # the 64 loading tokens have their blocks
    assert probe(m) == 0  # counted computed by vLLM, not yet written: no hit
    m.cache_blocks(request, 64)  # vLLM: the load finished
    assert probe(m) == 64


def test_a_load_that_fails_publishes_only_its_valid_prefix():
    m = manager()
    request = start_load(m)
    request.num_computed_tokens = 32  # vLLM truncates the request to the blocks that did load
    m.cache_blocks(request, 32)
    assert probe(m) == 32


def test_a_request_freed_while_its_load_is_in_flight_publishes_nothing():
    m = manager()
    request = start_load(m)
    free_before = m.block_pool.get_num_free_blocks()
    m.free(request)  # aborted (or a failed load with nothing valid): vLLM never confirmed the tokens
    assert probe(m) == 0
    assert m.block_pool.get_num_free_blocks() == free_before + 4


def test_a_sync_load_beside_a_local_hit_is_a_hit_once_computed():
    from hkv_vllm.drive import make_request

    m = manager()
    serve(m, make_request("first", PROMPT[:33], max_tokens=1))  # hkv caches two blocks
    request = start_load(m, local=32, external=32, delay=False)
    assert len(m.get_block_ids("loading")[0]) == 5
    assert probe(m) == 32  # the connector's tokens are not written until the step runs
    request.num_computed_tokens = len(PROMPT)
    m.free(request)
    assert probe(m) == 80  # local, loaded and computed: all five blocks


def test_evicting_blocks_hkv_never_published_changes_nothing():
    m = manager()
    request = start_load(m)
    before = (m.hkv.snapshot(), m.block_pool.get_num_free_blocks())
    m.evict_blocks(set(m.get_block_ids("loading")[0]))
    assert (m.hkv.snapshot(), m.block_pool.get_num_free_blocks()) == before
    m.free(request)


def test_evicting_a_published_block_or_no_block_is_refused():
    from hkv_core.errors import InvalidArgument
    from hkv_vllm import UnsupportedVllmConfig
    from hkv_vllm.drive import make_request

    m = manager()
    serve(m, make_request("first", PROMPT, max_tokens=1))
    blocks, hit, _ = m.get_computed_blocks(make_request("second", PROMPT + [1], max_tokens=1))
    published = blocks.get_block_ids()[0][0]
    before = m.hkv.snapshot()
    with pytest.raises(UnsupportedVllmConfig) as err:
        m.evict_blocks({published})
    assert err.value.feature == "evict_blocks" and str(published) in str(err.value)
    with pytest.raises(InvalidArgument):
        m.evict_blocks({10_000})
    assert m.hkv.snapshot() == before


def computed_request():
    """A manager and request "a" holding PROMPT's five blocks, every token computed."""
    from hkv_vllm.drive import make_request

    m = manager()
    request = make_request("a", PROMPT, max_tokens=1)
    m.get_computed_blocks(request)
    m.allocate_slots(request, len(PROMPT))
    request.num_computed_tokens = len(PROMPT)
    return m, request


def test_a_deferred_free_holds_the_blocks_until_vllm_returns_them():
    from hkv_core.errors import InvalidArgument

    m, request = computed_request()
    free_before = m.block_pool.get_num_free_blocks()
    blocks = m.pop_blocks_for_free(request)
    assert len(blocks) == 5 and m.block_pool.get_num_free_blocks() == free_before  # still held: a step may write
    assert probe(m) == 80  # what it computed is published at once
    with pytest.raises(InvalidArgument):
        m.block_pool.free_blocks(blocks[:2])  # not one deferred request's blocks
    m.block_pool.free_blocks(reversed(blocks))  # as vLLM's scheduler returns them
    assert m.block_pool.get_num_free_blocks() == free_before + 5
    with pytest.raises(InvalidArgument):
        m.block_pool.free_blocks(blocks)  # twice


def test_a_sync_load_is_no_hit_while_its_step_is_in_flight_under_async_scheduling():
    from hkv_vllm.drive import make_request

    m = manager()
    serve(m, make_request("first", PROMPT[:33], max_tokens=1))  # hkv caches two blocks
    request = start_load(m, local=32, external=32, delay=False)
    request.num_computed_tokens = len(PROMPT)  # step n scheduled: vLLM counts all 80 computed...
    request.num_in_flight_tokens = 16  # ...its 16 new tokens in flight; the load's 32 count written already
    m.allocate_slots(request, 1)  # async scheduling: step n+1 is scheduled before step n's output
    assert probe(m) == 32  # the load is not confirmed: vLLM may yet report its blocks invalid
    request.num_computed_tokens = 48  # it did: vLLM truncates to the valid prefix and recomputes the rest
    request.num_in_flight_tokens = 0
    m.cache_blocks(request, 48)
    assert probe(m) == 32
    request.num_computed_tokens = len(PROMPT)  # recomputed
    m.free(request)
    assert probe(m) == 80


def test_broken_variant_committing_a_sync_load_on_vllms_count_publishes_unconfirmed_blocks(monkeypatch):
    from hkv_vllm.requests import Entry

    monkeypatch.setattr(Entry, "unconfirmed", property(lambda self: None, lambda self, value: None))
    m = manager()
    request = start_load(m, local=0, external=64, delay=False)
    request.num_computed_tokens, request.num_in_flight_tokens = len(PROMPT), 16
    m.allocate_slots(request, 1)
    assert probe(m) == 64  # a load vLLM may still report failed is a hit for another request


def test_a_freed_request_whose_hkv_release_fails_is_kept_whole(monkeypatch):
    from hkv_core.errors import InvalidArgument

    m, request = computed_request()
    held = m.block_pool.get_num_free_blocks()

    def failing(rid):
        raise InvalidArgument(action="release", argument="rid", value=rid, reason="injected")

    monkeypatch.setattr(m.hkv, "release", failing)
    with pytest.raises(InvalidArgument):
        m.free(request)
    assert "a" in m.entries and m.block_pool.get_num_free_blocks() == held  # nothing half-done
    blocks = m.pop_blocks_for_free(request)  # deferred: nothing released yet
    with pytest.raises(InvalidArgument):
        m.block_pool.free_blocks(blocks)
    assert len(m.deferred) == 1 and m.block_pool.get_num_free_blocks() == held  # still deferred, still held
    monkeypatch.undo()
    m.block_pool.free_blocks(blocks)
    assert not m.entries and not m.deferred and m.block_pool.get_num_free_blocks() == held + 5
