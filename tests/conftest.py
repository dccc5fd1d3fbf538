"""Shared test set-up: hypothesis profiles.

`ci` (the default) runs enough examples to matter in under ~10 minutes on 2
cores; `deep` is for long runs: `HYPOTHESIS_PROFILE=deep pytest`.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=5_000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=30, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
