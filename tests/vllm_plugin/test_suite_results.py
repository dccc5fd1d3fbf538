"""The vLLM suite's reason classes: a refusal wins over a known difference, unknown failures stay visible."""

from hkv_vllm.suite.results import BLOCK_HASHES, INTERNALS, VISIBILITY, Outcome, compare, reason_class

REFUSED = "hkv_vllm.errors.UnsupportedVllmConfig: vLLM config: kv_cache_groups[1]: not supported: a MambaSpec"


def test_a_refusal_is_classed_by_feature_even_for_a_known_test():
    assert reason_class(REFUSED, "test_prefill_hybrid_model_combinations[2g-full+mamba]") == \
        "not served yet: kv_cache_groups"
    assert reason_class("assert 0 == 48", "test_prefill_hybrid_model_combinations[2g-full+sw]") == VISIBILITY
    assert reason_class("assert 'CoordinatorView' == 'X'", "test_pure_swa_retention_interval_caches_sparse_tails") \
        == INTERNALS
    assert reason_class("AttributeError: 'FreeQueueView' object has no attribute 'get_all_free_blocks'",
                        "test_evict") == INTERNALS
    assert reason_class("assert None is not None", "test_prefill[sha256]") == BLOCK_HASHES


def test_an_unexplained_failure_is_a_behaviour_difference_listed_by_name():
    stock = {"f.py::t": Outcome(file="f.py", name="test_new_thing", failure=None, skipped=False)}
    ours = {"f.py::t": Outcome(file="f.py", name="test_new_thing", failure="assert 3 == 4", skipped=False)}
    result = compare(stock, ours)
    assert result.classes == {"behaviour difference": 1}
    assert result.differences == ("f.py::t",)
