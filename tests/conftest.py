"""Shared test set-up: hypothesis profiles, and a reference executor whose tier loads fail.

`ci` (the default) runs enough examples to matter in under ~10 minutes on 2
cores; `deep` is for long runs: `HYPOTHESIS_PROFILE=deep pytest`.
"""

import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from hkv_core.plan import Completion, LoadRecord, Plan
from hkv_exec_ref.executor import RefExecutor

settings.register_profile("ci", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=5_000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=30, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


class FailingLoads(RefExecutor):
    """A reference executor whose load plans report a failed copy after writing garbage into the targets."""

    def run(self, plan: Plan, records: Any = None) -> Completion:
        if not any(isinstance(op, LoadRecord) for op in plan.ops):
            return super().run(plan, records)
        super().run(plan, {name: np.full_like(buffer, 0x7F) for name, buffer in (records or {}).items()})
        return Completion(ok=False, error="injected copy failure")


@pytest.fixture
def failing_loads() -> FailingLoads:
    """A fresh FailingLoads executor."""
    return FailingLoads()
