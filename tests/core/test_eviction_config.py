"""The eviction policy is chosen at construction: ManagerConfig(eviction=...) or a factory, never by assigning
into the manager's internals."""

import pytest

from hkv_core.errors import ConfigError, InvalidArgument
from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig
from hkv_core.manager.index.adaptive import AdaptivePolicy
from hkv_core.manager.index.policy import LruPolicy

LAYOUT = Layout.from_preset("llama_full", block_tokens=16)


def manager(**config):
    return CacheManager(LAYOUT, ManagerConfig(default_pool_pages=64, max_request_tokens=1024, **config))


@pytest.mark.parametrize(("eviction", "kind"), [("lru", LruPolicy), ("adaptive", AdaptivePolicy)])
def test_the_config_names_the_policy_and_a_clone_keeps_it(eviction, kind):
    m = manager(eviction=eviction)
    assert isinstance(m.core.index.policy, kind) and isinstance(m.clone().core.index.policy, kind)
    assert m.core.index.policy is not m.clone().core.index.policy


def test_lru_is_the_default():
    assert ManagerConfig().eviction == "lru" and isinstance(manager().core.index.policy, LruPolicy)


@pytest.mark.parametrize("bad", ["mru", "LRU", "", None, 1])
def test_an_unknown_policy_is_refused_by_name(bad):
    with pytest.raises(ConfigError) as err:
        ManagerConfig(eviction=bad)
    assert err.value.key == "eviction"


def test_a_factory_runs_any_policy_and_a_non_callable_is_refused():
    made = []

    def factory(rows, keys):
        made.append((rows, keys.shape))
        return LruPolicy(rows)

    m = CacheManager(LAYOUT, ManagerConfig(default_pool_pages=64), eviction_policy=factory)
    assert made == [(m.core.limits.block_rows, (m.core.limits.block_rows, 2))]
    with pytest.raises(InvalidArgument) as err:
        CacheManager(LAYOUT, ManagerConfig(default_pool_pages=64), eviction_policy=LruPolicy(8))
    assert err.value.argument == "eviction_policy"


def test_a_serving_manager_tells_the_adaptive_policy_each_requests_output_tokens():
    m = manager(eviction="adaptive")
    policy = m.core.index.policy
    for outputs, bucket in ((5, 3), (0, 3), (40, 6)):  # log2 buckets; a request with no outputs changes nothing
        rid = m.add_request(list(range(32)))
        m.acquire(rid, m.match(rid))
        m.allocate(rid, 32 - m.request_tokens(rid)[0])
        m.commit(rid, 32 - m.request_tokens(rid)[0])
        if outputs:
            m.append_tokens(rid, list(range(100, 100 + outputs)))
        m.release(rid)
        assert policy.bucket == bucket
