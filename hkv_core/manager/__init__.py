"""The cache manager: page pools, prefix index, roles, hit validation, leases, plans, eviction."""

from hkv_core.errors import (
    AdmissionRejected,
    InvalidArgument,
    InvalidRequestArgument,
    InvalidRequestState,
    InvariantViolation,
    MetadataTooLarge,
    OutOfPages,
    StaleLease,
    UnknownPlan,
    UnknownRequest,
)
from hkv_core.executor import DeviceEstimate
from hkv_core.manager.config import ManagerConfig
from hkv_core.manager.footprint import MetadataEstimate, estimate_device_bytes, estimate_metadata
from hkv_core.manager.invariants import check_invariants
from hkv_core.manager.lanes import PoolRole
from hkv_core.manager.manager import CacheManager
from hkv_core.manager.records import Allocation, Hit, Reason
from hkv_core.plan import CopyPages
from hkv_core.units import NULL_PAGE

__all__ = ["NULL_PAGE", "AdmissionRejected", "Allocation", "CacheManager", "CopyPages", "DeviceEstimate", "Hit",
           "InvalidArgument",
           "InvalidRequestArgument", "InvalidRequestState", "InvariantViolation", "ManagerConfig", "MetadataEstimate",
           "MetadataTooLarge", "OutOfPages", "PoolRole", "Reason", "StaleLease", "UnknownPlan", "UnknownRequest",
           "check_invariants", "estimate_device_bytes", "estimate_metadata"]
