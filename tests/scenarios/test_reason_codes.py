"""Every reason code of specs/validation.toml is produced by at least one manager scenario."""

from __future__ import annotations

import functools

from test_manager_scenarios import SCENARIOS

from hkv_core.spec.validation import load_validation


@functools.cache
def produced_codes() -> dict[str, frozenset[str]]:
    """Code -> the validation layers the scenarios' hits reported it from."""
    seen: dict[str, set[str]] = {}
    for scenario in SCENARIOS:
        for hit in scenario().hits.values():
            for reason in hit.reasons:
                seen.setdefault(reason.code, set()).add(reason.layer)
    return {code: frozenset(layers) for code, layers in seen.items()}


def test_scenarios_produce_every_reason_code_of_the_device_tier() -> None:
    spec = load_validation().codes
    seen = produced_codes()
    assert set(seen) <= set(spec), f"codes outside specs/validation.toml: {sorted(set(seen) - set(spec))}"
    missing = sorted(set(spec) - set(seen))
    assert missing == [], f"no scenario produces {missing}"
    for code, layers in seen.items():  # each code is reported by the layer the spec puts it in
        assert layers == {spec[code].layer}, (code, layers)
    assert {spec[c].kind for c in seen} == {"shorten", "reject", "rule"}
