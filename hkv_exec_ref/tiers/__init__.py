"""Tiers of the reference executor: host records in a fixed arena, disk records in a crash-safe directory,
records shared through a Mooncake Store (RemoteStore, RemoteTierConfig, MooncakeMaster for a local master),
block spans between the pools and records, and every tier together (TierCache)."""

from hkv_exec_ref.tiers.disk_store import Crash, DiskFaults, DiskStore
from hkv_exec_ref.tiers.host_store import HostStore
from hkv_exec_ref.tiers.mooncake_master import MooncakeMaster
from hkv_exec_ref.tiers.remote_config import RemoteFaults, RemoteTierConfig
from hkv_exec_ref.tiers.remote_store import RemoteStore
from hkv_exec_ref.tiers.tier_cache import TierCache

__all__ = ["Crash", "DiskFaults", "DiskStore", "HostStore", "MooncakeMaster", "RemoteFaults", "RemoteStore",
           "RemoteTierConfig", "TierCache"]
