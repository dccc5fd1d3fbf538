"""Tiers of the reference executor: the disk store (crash-safe records under a byte budget)."""

from hkv_exec_ref.tiers.disk_store import Crash, DiskFaults, DiskStore

__all__ = ["Crash", "DiskFaults", "DiskStore"]
