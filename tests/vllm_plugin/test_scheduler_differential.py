"""Stock vLLM and hkv's adapter schedule the same full-attention workloads alike, step by step."""

import pytest

from tests.vllm_plugin.conftest import HAS_VLLM, SKIP_REASON

pytestmark = pytest.mark.skipif(not HAS_VLLM, reason=SKIP_REASON)


def conversations(turns: int = 3, users: int = 4, system: int = 40, block_size: int = 16) -> dict[int, list]:
    """Multi-turn chats sharing a system prompt: turn t of user u arrives at step 6*t + u, its prompt the
    previous turn's prompt plus 20 new tokens; vLLM hashes each request in blocks of `block_size` (the
    scheduler's hash block size)."""
    from hkv_vllm.drive import make_request

    arrivals: dict[int, list] = {}
    for user in range(users):
        prompt = list(range(1000, 1000 + system))
        for turn in range(turns):
            prompt = prompt + [2000 + 100 * user + 10 * turn + i for i in range(20)]
            arrivals.setdefault(8 * turn + 2 * user, []).append(
                make_request(f"u{user}t{turn}", prompt, max_tokens=6, block_size=block_size))
    return arrivals


def schedule_both(arrivals_fn, asynchronous=False, **kwargs):
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    import hkv_vllm
    from hkv_vllm.drive import build_scheduler, run

    stock_cls, ours_cls = ((AsyncScheduler, hkv_vllm.AsyncScheduler) if asynchronous
                           else (Scheduler, hkv_vllm.Scheduler))
    stock = run(build_scheduler(stock_cls, **kwargs), arrivals_fn())
    ours = run(build_scheduler(ours_cls, **kwargs), arrivals_fn())
    return stock, ours


def test_conversations_schedule_identically_with_hits():
    stock, ours = schedule_both(conversations, num_blocks=2000)
    assert ours == stock
    cached = sum(n for s in ours for _, n in s.cached)
    assert cached >= 16 * 8  # every later turn resumes from the earlier one's blocks
    assert sum(len(s.finished) for s in ours) == 12


def test_under_memory_pressure_evictions_and_preemptions_match():
    """13 usable blocks for chats of up to 106 tokens: cached blocks are evicted, a request is preempted and
    resumed - the same steps, hits and preemptions as vLLM's own manager."""
    stock, ours = schedule_both(conversations, num_blocks=14, max_num_batched_tokens=32)
    assert ours == stock
    assert sum(len(s.preempted) for s in ours) >= 1
    roomy = sum(n for s in schedule_both(conversations, num_blocks=2000)[1] for _, n in s.cached)
    assert 0 < sum(n for s in ours for _, n in s.cached) < roomy  # evictions cost hits, on both alike
    assert sum(len(s.finished) for s in ours) == 12


def twins():
    from hkv_vllm.drive import make_request

    prompt = list(range(64))
    return {0: [make_request("a", prompt, max_tokens=2), make_request("b", prompt, max_tokens=2)]}


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_request_sharing_a_prefill_in_flight_waits_for_it(asynchronous):
    """vLLM caches a block when it is scheduled; hkv only once it is computed (docs/vllm.md): of two equal
    prompts arriving together, vLLM resumes the second from the first's blocks being written in the same step,
    hkv's scheduler leaves it waiting until they are written, then resumes it from them (`in_flight.py`).
    It waits only while waiting would lengthen its hit: under async scheduling hkv keeps two steps' blocks in
    flight, and this drive reports each step before the next, so it resumes one step on there too."""
    stock, ours = schedule_both(twins, asynchronous=asynchronous, num_blocks=100)
    assert dict(stock[0].cached) == {"a": 0, "b": 48}  # vLLM: b reads a's blocks being written in this step
    assert dict(ours[0].cached) == {"a": 0}
    assert dict(ours[1].cached) == {"b": 48}


def test_the_requests_queued_after_a_waiting_one_wait_with_it():
    """First come, first served, as when vLLM cannot allocate: a request queued behind one that waits for a
    shared prefill is not scheduled ahead of it, even if it shares nothing."""
    import hkv_vllm
    from hkv_vllm.drive import build_scheduler, make_request, run

    prompt = list(range(64))
    arrivals = {0: [make_request("a", prompt, max_tokens=2), make_request("b", prompt, max_tokens=2),
                    make_request("c", list(range(100, 164)), max_tokens=2)]}
    ours = run(build_scheduler(hkv_vllm.Scheduler, num_blocks=100), arrivals)
    assert dict(ours[0].cached) == {"a": 0}
    assert dict(ours[1].cached) == {"b": 48, "c": 0}


def test_without_waiting_a_shared_prefill_is_computed_twice():
    """The broken variant (`wait_for_shared_prefills` off): both compute from token 0 in the first step."""
    import hkv_vllm
    from hkv_vllm.drive import build_scheduler, run

    ours = run(build_scheduler(hkv_vllm.Scheduler, num_blocks=100,
                               additional_config={"hkv": {"wait_for_shared_prefills": False}}), twins())
    assert dict(ours[0].cached) == {"a": 0, "b": 0}


@pytest.mark.parametrize("windows", [(0, 32), (0, 32, 0, 64), (32, 64)], ids=["full+sw", "full+sw+full+sw64",
                                                                             "sw+sw64"])
def test_hybrid_groups_schedule_identically_with_hits(windows):
    """Full-attention and sliding-window groups with room for everything: the same steps and hits as vLLM's
    hybrid manager - every hit resumes with its window present, nothing recomputed."""
    stock, ours = schedule_both(conversations, num_blocks=2000 * len(windows), windows=windows)
    assert ours == stock
    assert sum(n for s in ours for _, n in s.cached) >= 16 * 8
    assert sum(len(s.finished) for s in ours) == 12


def test_hybrid_groups_under_memory_pressure_hit_at_least_vllm():
    """A full + sliding-window model in 27 blocks, which both groups draw from (one block space, as vLLM's):
    the steps differ where the two evict differently; every request finishes, cached blocks are evicted, and
    hkv's hits total at least vLLM's."""
    stock, ours = schedule_both(conversations, num_blocks=27, max_num_batched_tokens=32, windows=(0, 32))
    assert sum(len(s.finished) for s in ours) == sum(len(s.finished) for s in stock) == 12
    hits = [sum(n for s in run for _, n in s.cached) for run in (stock, ours)]
    roomy = sum(n for s in schedule_both(conversations, num_blocks=4000, windows=(0, 32))[1] for _, n in s.cached)
    assert 0 < hits[1] < roomy
    assert hits[1] >= hits[0], hits


SWEEP = {  # (windows, blocks): hybrid layouts at sizes where blocks are scarce (docs/vllm.md, the sweep)
    "full+sw32-14": ((0, 32), 14), "full+sw32-21": ((0, 32), 21), "full+sw32-31": ((0, 32), 31),
    "full+sw32-35": ((0, 32), 35), "full+sw32+full+sw64-27": ((0, 32, 0, 64), 27),
    "full+sw32+full+sw64-45": ((0, 32, 0, 64), 45),
}


def _sweep_hits(windows, blocks):
    stock, ours = schedule_both(conversations, num_blocks=blocks, max_num_batched_tokens=32, windows=windows)
    assert sum(len(s.finished) for s in ours) == sum(len(s.finished) for s in stock) == 12
    return [sum(n for s in run for _, n in s.cached) for run in (stock, ours)]


@pytest.mark.parametrize("case", list(SWEEP))
def test_scarce_blocks_hit_at_least_vllm(case):
    hits = _sweep_hits(*SWEEP[case])
    assert hits[1] >= hits[0] > 0, hits


def test_an_eviction_that_drops_points_freeing_nothing_is_caught(monkeypatch):
    """The broken variant: an eviction for an allocation drops every point it planned, also those whose pages
    running requests still hold (the junction every user resumes at among them); at 35 blocks hkv then hits
    fewer tokens than vLLM."""
    from hkv_core.manager import evict

    monkeypatch.setattr(evict, "_useful_points", lambda core, walk, cut, points, p_pos, blocks: points)
    hits = _sweep_hits(*SWEEP["full+sw32-35"])
    assert hits[1] < hits[0], hits


@pytest.mark.parametrize(("windows", "sizes"), [((0, 16), (32, 16)), ((0, 16, 0), (64, 16, 16))],
                         ids=["full32+sw16", "full64+sw16+full16"])
def test_groups_of_different_block_sizes_schedule_identically_with_hits(windows, sizes):
    """Groups of different block sizes (as vLLM lays out DeepSeek-V4's compressor groups beside its KV): vLLM
    schedules in blocks of their LCM and hashes in 16-token blocks, hkv keys 16-token blocks and pages each
    group in its own block size - the same steps and hits (on the LCM), nothing recomputed."""
    stock, ours = schedule_both(conversations, num_blocks=2000 * len(windows), windows=windows, block_sizes=sizes)
    assert ours == stock
    hits = [n for s in ours for _, n in s.cached if n]
    assert sum(hits) >= 16 * 4 and all(n % max(sizes) == 0 for n in hits), hits
    assert sum(len(s.finished) for s in ours) == 12


def test_groups_of_different_block_sizes_under_memory_pressure_hit_at_least_vllm():
    """Full attention in 32-token blocks beside a 16-token window in 16-token blocks, in 19 blocks both groups
    draw from: cached blocks are evicted, every request finishes, and hkv's hits total at least vLLM's
    (docs/vllm.md has the sweep over sizes)."""
    stock, ours = schedule_both(conversations, num_blocks=19, max_num_batched_tokens=32, windows=(0, 16),
                                block_sizes=(32, 16))
    assert sum(len(s.finished) for s in ours) == sum(len(s.finished) for s in stock) == 12
    hits = [sum(n for s in run for _, n in s.cached) for run in (stock, ours)]
    roomy = sum(n for s in schedule_both(conversations, num_blocks=4000, windows=(0, 16),
                                         block_sizes=(32, 16))[1] for _, n in s.cached)
    assert hits[1] >= hits[0] > 0 and hits[1] < roomy, (hits, roomy)


@pytest.mark.parametrize(("blocks", "batched"), [(2000, 8192), (14, 32)], ids=["ample", "13-blocks"])
def test_async_scheduling_schedules_identically(blocks, batched):
    """vLLM's AsyncScheduler (step n+1 scheduled before step n's token is sampled: slots reserved ahead) with
    its stock manager and with hkv's: the same steps, hits and preemptions, with room and under pressure."""
    stock, ours = schedule_both(conversations, asynchronous=True, num_blocks=blocks, max_num_batched_tokens=batched)
    assert ours == stock
    assert sum(n for s in ours for _, n in s.cached) >= (16 * 8 if blocks > 100 else 1)
    assert sum(len(s.finished) for s in ours) == 12
    if blocks < 100:
        assert sum(len(s.preempted) for s in ours) >= 1
