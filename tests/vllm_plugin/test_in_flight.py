"""PrefillsInFlight: which waiting requests would resume further by waiting a step (no vLLM needed)."""

import pytest

from hkv_vllm.in_flight import PrefillsInFlight


def hashes(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def no_hit() -> int:
    return 0


def test_a_request_waits_while_blocks_past_its_hit_are_in_flight():
    flight = PrefillsInFlight(4, 16)
    flight.record(hashes("a", 10), 0, 40, 40)  # blocks 0..9 of a's prompt in this step
    assert flight.waits(hashes("a", 10), 40, no_hit)  # would resume at 32 instead of 0
    assert not flight.waits(hashes("a", 10), 40, lambda: 32)  # already resumes at 32: nothing to wait for
    assert not flight.waits(hashes("b", 10), 40, no_hit)  # shares nothing


def test_it_never_waits_for_less_than_a_hit_step_or_for_its_own_last_token():
    flight = PrefillsInFlight(4, 16)
    flight.record(hashes("a", 3), 0, 12, 12)  # 12 tokens: short of a 16-token hit
    assert not flight.waits(hashes("a", 3), 12, no_hit)
    flight.record(hashes("c", 4), 0, 16, 16)  # 16 tokens, but a hit stops short of the prompt's last token
    assert not flight.waits(hashes("c", 4), 16, no_hit)
    assert flight.waits(hashes("c", 5), 17, no_hit)  # a longer prompt resumes at 16


def test_only_prompt_blocks_complete_in_the_step_are_in_flight():
    flight = PrefillsInFlight(4, 4)
    flight.record(hashes("a", 10), 8, 14, 40)  # tokens 8..13: block 2 completes, block 3 does not
    assert flight.waits(hashes("a", 10), 40, lambda: 8)
    assert not flight.waits(hashes("a", 10), 40, lambda: 12)
    flight.record(hashes("d", 10), 0, 40, 20)  # past the prompt: decode tokens are never in flight
    assert not flight.waits(hashes("d", 10), 40, lambda: 20)


def test_blocks_leave_flight_as_steps_are_written():
    flight = PrefillsInFlight(4, 4)
    flight.record(hashes("a", 4), 0, 16, 16)
    flight.next_step()
    assert not flight.waits(hashes("a", 5), 20, no_hit)
    flight.steps = 2  # async scheduling: the step before is still in flight
    flight.record(hashes("a", 4), 0, 16, 16)
    flight.next_step()
    assert flight.waits(hashes("a", 5), 20, no_hit)
    flight.next_step()
    assert not flight.waits(hashes("a", 5), 20, no_hit)


def test_the_hit_is_asked_only_when_a_block_is_in_flight():
    flight = PrefillsInFlight(4, 4)
    asked = []
    assert not flight.waits(hashes("a", 4), 16, lambda: asked.append(1) or 0)
    flight.record(hashes("b", 4), 0, 16, 16)
    assert not flight.waits(hashes("a", 4), 16, lambda: asked.append(1) or 0)
    assert not asked


def test_a_step_that_waits_holds_the_requests_after_it():
    flight = PrefillsInFlight(4, 4)
    flight.holding = True
    flight.next_step()
    assert not flight.holding


@pytest.mark.parametrize("args", [(0, 4), (4, 0), (4, 4, 0)])
def test_bad_sizes_are_refused(args):
    with pytest.raises(ValueError, match="must be positive"):
        PrefillsInFlight(*args[:2], **({"steps": args[2]} if len(args) > 2 else {}))


def test_once_a_request_waits_the_later_ones_of_the_step_wait_too():
    flight = PrefillsInFlight(4, 4)
    flight.record(hashes("a", 4), 0, 16, 16)
    assert not flight.queue_waits(hashes("b", 5), 20, no_hit)  # shares nothing: goes ahead
    assert flight.queue_waits(hashes("a", 5), 20, no_hit)
    assert flight.queue_waits(hashes("b", 5), 20, no_hit)  # queued after a waiting request
    flight.next_step()
    assert not flight.queue_waits(hashes("b", 5), 20, no_hit)
