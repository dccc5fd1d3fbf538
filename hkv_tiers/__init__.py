"""hkv's tiers, for any executor (they import hkv_core only): one Store interface (store.py) that the host
tier (records in a fixed arena), the disk tier (a crash-safe directory) and the remote tier (a Mooncake Store:
RemoteStore, RemoteTierConfig, MooncakeMaster for a local master) implement, block spans between the pools
and records, every tier together (TierCache), and the link between a CacheManager and them (TierOptions,
TierLink in link.py)."""

from hkv_tiers.disk_store import Crash, DiskFaults, DiskStore
from hkv_tiers.host_arena import HostArena
from hkv_tiers.host_store import HostStore
from hkv_tiers.mooncake_master import MooncakeMaster
from hkv_tiers.remote_config import RemoteFaults, RemoteTierConfig
from hkv_tiers.remote_store import RemoteStore
from hkv_tiers.store import Store
from hkv_tiers.tier_cache import TierCache

STORES: tuple[type[Store], ...] = (HostStore, DiskStore, RemoteStore)  # every tier's store (mypy checks each)

__all__ = ["Crash", "DiskFaults", "DiskStore", "HostArena", "HostStore", "MooncakeMaster", "RemoteFaults",
           "RemoteStore", "RemoteTierConfig", "STORES", "Store", "TierCache"]
