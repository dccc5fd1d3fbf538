"""A tier's eviction order through the device's policies: LRU exactly as a reference model says, children before
parents under both policies, growth that keeps the order, and an engine whose tiers run the adaptive policy
serving exactly."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tier_workload import Sessions, pages_leaked, tiny

from hkv_core.errors import InvalidArgument
from hkv_core.manager.index.adaptive import AdaptivePolicy
from hkv_core.manager.index.policy import LruPolicy
from hkv_tiers.tier_order import TierOrder

NAMES = [f"r{i}" for i in range(12)]
OPS = st.lists(st.tuples(st.sampled_from(["add", "touch", "del"]), st.lists(st.sampled_from(NAMES), max_size=4)),
               max_size=40)


def lru_model(ops: Sequence[tuple[str, list[str]]]) -> list[str]:
    """What an LRU tier holds, least recent first: an OrderedDict, touched deepest first."""
    model: OrderedDict[str, None] = OrderedDict()
    for op, names in ops:
        if op == "add":
            for name in names:
                model.setdefault(name, None)
        elif op == "touch":
            for name in reversed(names):
                if name in model:
                    model.move_to_end(name)
        else:
            for name in names:
                model.pop(name, None)
    return list(model)


def run(order: TierOrder, ops: Sequence[tuple[str, list[str]]]) -> None:
    for op, names in ops:
        if op == "add":
            order.add(names)
        elif op == "touch":
            order.touch(names)
        else:
            for name in names:
                if name in order:
                    del order[name]


@given(OPS)
def test_lru_order_is_the_reference_models_through_growth(ops: list[tuple[str, list[str]]]) -> None:
    order = TierOrder("lru", rows=2)  # grows (doubling, order kept) as records arrive
    run(order, ops)
    assert list(order) == lru_model(ops)
    assert len(order) == len(lru_model(ops)) and all(name in order for name in lru_model(ops))


def heads_outlive_tails(order: TierOrder, chains: Sequence[Sequence[str]]) -> bool:
    """Whether every held record of each chain (root first) comes after its descendants in eviction order."""
    at = {name: i for i, name in enumerate(order)}
    return all(at[parent] > at[child] for chain in chains
               for parent, child in zip(chain, chain[1:], strict=False) if parent in at and child in at)


CHAIN = st.lists(st.sampled_from(range(6)), min_size=1, max_size=5, unique=True)


@pytest.mark.parametrize("eviction", ["lru", "adaptive"])
@given(st.lists(st.tuples(st.sampled_from(range(3)), st.integers(1, 5)), min_size=1, max_size=30))
def test_children_leave_before_their_parents_under_both_policies(eviction: str,
                                                                 touches: list[tuple[int, int]]) -> None:
    """Prefixes of three chains (a block record, then its point record, per block): each touch enters and
    touches one prefix root first, as TierCache does; a head never leaves before its tail."""
    chains = [[f"c{c}b{b}{kind}" for b in range(5) for kind in ("", "-p")] for c in range(3)]
    order = TierOrder(eviction, rows=4)
    for chain, blocks in touches:
        prefix = chains[chain][:2 * blocks]
        order.add(reversed(prefix))  # new records enter deepest first (a load brings the prefix), then the touch
        order.touch(prefix)
        assert heads_outlive_tails(order, chains), list(order)


def test_a_root_last_touch_is_caught_by_the_dependency_check() -> None:
    """Broken variant: a touch that passes a prefix root last puts the head before its tail in eviction
    order - the check above fails on it."""
    order = TierOrder("lru")
    prefix = ["a", "a-p", "b", "b-p"]
    order.add(prefix)
    order.touch(prefix[::-1])
    assert not heads_outlive_tails(order, [prefix])


@pytest.mark.parametrize(("eviction", "kind"), [("lru", LruPolicy), ("adaptive", AdaptivePolicy)])
def test_each_policy_orders_the_tier(eviction: str, kind: type) -> None:
    assert isinstance(TierOrder(eviction).policy, kind)


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="lru, adaptive"):
        TierOrder("fifo")


def test_forgetting_a_record_it_does_not_hold_is_a_key_error_and_changes_nothing() -> None:
    order = TierOrder()
    order.add(["a", "b"])
    with pytest.raises(KeyError):
        del order["c"]
    assert list(order) == ["a", "b"]
    order.clear()
    assert list(order) == [] and len(order) == 0


def test_an_engine_whose_tiers_run_the_adaptive_policy_serves_exactly(tmp_path: Path) -> None:
    """ManagerConfig(eviction="adaptive") orders the device and both tiers: records keep moving to disk and
    back, every output equals recomputation (Sessions checks each), nothing leaks."""
    engine = tiny(tmp_path, eviction="adaptive")
    assert engine.tiers is not None
    cache = engine.tiers.cache
    assert isinstance(cache.host_order.policy, AdaptivePolicy) and isinstance(cache.disk_order.policy, AdaptivePolicy)
    sessions = Sessions()
    for _ in range(4):
        sessions.round(engine)
    counts = cache.report()["counts"]
    assert counts["demoted"] > 0 and counts["loaded_disk"] > 0 and counts["loaded_host"] > 0, counts
    assert set(cache.host_order) == set(cache.host.headers)  # the order holds exactly the arena's records
    assert pages_leaked(engine) == {}
    engine.close()
    reopened = tiny(tmp_path, eviction="adaptive")
    assert reopened.tiers is not None and len(reopened.tiers.cache.disk_order) > 0
    prompt = sessions.prompts[0]
    served = reopened.generate(prompt, 2)
    assert served.cached_tokens > 0 and reopened.matches_recompute(prompt, served)
    reopened.close()


def test_the_order_holds_rows_for_every_name_and_no_more() -> None:
    order = TierOrder(rows=2)
    order.add(NAMES)
    assert order.rows >= len(NAMES) and sorted(order.row_of.values()) == sorted(set(order.row_of.values()))
    for name in NAMES[:5]:
        del order[name]
    order.add(["x", "y"])
    assert order.rows == 16 and len(order) == len(NAMES) - 5 + 2  # freed rows taken again: no growth
    assert np.count_nonzero([n is not None for n in order.name_of]) == len(order)
