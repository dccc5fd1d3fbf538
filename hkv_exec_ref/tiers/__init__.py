"""Tiers of the reference executor: host records in a fixed arena, disk records in a crash-safe directory,
block spans between the pools and records, and the two tiers together (TierCache)."""

from hkv_exec_ref.tiers.disk_store import Crash, DiskFaults, DiskStore
from hkv_exec_ref.tiers.host_store import HostStore
from hkv_exec_ref.tiers.tier_cache import TierCache

__all__ = ["Crash", "DiskFaults", "DiskStore", "HostStore", "TierCache"]
