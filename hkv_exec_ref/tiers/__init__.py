"""Tiers of the reference executor: host records in a fixed arena, disk records in a crash-safe directory."""

from hkv_exec_ref.tiers.disk_store import Crash, DiskFaults, DiskStore
from hkv_exec_ref.tiers.host_store import HostStore

__all__ = ["Crash", "DiskFaults", "DiskStore", "HostStore"]
