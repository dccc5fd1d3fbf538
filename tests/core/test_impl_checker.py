"""The implementation-level model check drives the real CacheManager and can fail."""

import numpy as np
import pytest

from hkv_core.checker.impl import ImplCheckConfig, check_implementation
from hkv_core.manager import evict, release

SMALL = ImplCheckConfig(max_depth=5)


def test_default_bound_explores_5000_states_cleanly() -> None:
    result = check_implementation()
    assert result.states_explored >= 5_000
    assert result.failed_calls > 0, "the bound must reach failing calls (full pools, stale leases)"
    assert result.violations == ()


def test_release_that_forgets_to_unpin_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(release, "unpin", lambda core, req, pool, pages: None)
    found = dict(check_implementation(SMALL).violations)
    assert "refcount_matches_leases" in found
    assert any(step.startswith("release(") for step in found["refcount_matches_leases"])


def test_eviction_of_pinned_pages_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evict, "_pinned_mask", lambda core, blocks: np.zeros(len(blocks), np.bool_))
    found = dict(check_implementation(ImplCheckConfig(max_depth=6)).violations)
    # the lifecycle table refuses to evict a pinned page (guard `unpinned`), half-way through an
    # eviction: the checker reports the half-done call with its trace
    assert "failed_call_changed_state" in found
    assert found["failed_call_changed_state"][-1].startswith("evict(")


def test_failed_call_that_changes_state_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from hkv_core.manager import alloc

    real = alloc._needs

    def leaky(core, req, start, end):  # type: ignore[no-untyped-def]
        counts, cows, bounds = real(core, req, start, end)
        req.tokens = np.concatenate([req.tokens, [0]])  # a side effect before OutOfPages
        return counts, cows, bounds

    monkeypatch.setattr(alloc, "_needs", leaky)
    found = dict(check_implementation(ImplCheckConfig(max_depth=6)).violations)
    assert "failed_call_changed_state" in found
