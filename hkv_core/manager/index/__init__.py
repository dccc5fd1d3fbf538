"""The prefix index: key table, blocks, resume points, eviction order."""

from hkv_core.manager.index.blocks import NO_BLOCK, NO_POINT, BlockTable
from hkv_core.manager.index.event_log import EventLog
from hkv_core.manager.index.points import PointTable
from hkv_core.manager.index.prefix_index import PrefixIndex

__all__ = ["NO_BLOCK", "NO_POINT", "BlockTable", "EventLog", "PointTable", "PrefixIndex"]
