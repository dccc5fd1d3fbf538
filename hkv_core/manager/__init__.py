"""The cache manager: prefix index, hit validation, leases, allocation, eviction."""

from hkv_core.manager.config import ManagerConfig
from hkv_core.manager.errors import (
           AdmissionRejected,
           InvalidRequestState,
           OutOfPages,
           StaleLease,
           UnknownRequest,
)
from hkv_core.manager.invariants import InvariantViolation, check_invariants
from hkv_core.manager.manager import CacheManager
from hkv_core.manager.pools import NULL_PAGE, PoolRole
from hkv_core.manager.records import Allocation, CopyPages, Hit, Reason

__all__ = ["NULL_PAGE", "AdmissionRejected", "Allocation", "CacheManager", "CopyPages", "Hit",
           "InvalidRequestState", "InvariantViolation", "ManagerConfig", "OutOfPages", "PoolRole", "Reason",
           "StaleLease", "UnknownRequest", "check_invariants"]
