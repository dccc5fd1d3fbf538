"""Bounded exhaustive model checker of the lifecycle spec (`hkv check`)."""

from hkv_core.checker.explore import CheckResult, Violation, check
from hkv_core.checker.world import CheckConfig

__all__ = ["CheckConfig", "CheckResult", "Violation", "check"]
