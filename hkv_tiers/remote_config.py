"""How an engine reaches a shared remote tier (a Mooncake Store master), and the faults tests inject into it.

`RemoteTierConfig(master="127.0.0.1:50051", metadata="http://127.0.0.1:8089/metadata")` is all an engine needs:
the master's RPC address and its HTTP metadata server.  The rest has defaults: the memory this instance lends
the store (`segment_bytes`), the client's transfer buffer (`buffer_bytes`), the registered staging arena hkv
copies records through (`staging_bytes`), the deadline after which a lookup or a get is a miss, and how long the
tier stays marked unavailable after a failure before it is probed again.  docs/remote.md says what each is for.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import attrs

from hkv_core.errors import ConfigError
from hkv_tiers.fault_switch import take_fault

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]
PROTOCOLS = ("tcp", "rdma")  # Mooncake transfer engine protocols
_HOST_PORT = re.compile(r"^[A-Za-z0-9_.\-]+:\d{1,5}$")
_URL = re.compile(r"^https?://[A-Za-z0-9_.\-]+:\d{1,5}/\S*$")
_NAMESPACE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
MIN_SEGMENT_BYTES = 16 << 20  # Mooncake's client refuses a smaller segment (its setup returns -600)
NO_SEGMENT = 0  # an instance that lends no memory: its records live in a store process's segment


@attrs.define
class RemoteFaults:
    """Injected remote faults (tests), each firing on the next `count` operations of its kind."""

    slow_get: int = 0  # the next gets each wait `slow_seconds` first (past the deadline: a miss)
    slow_seconds: float = 0.5
    flip_byte: int = 0  # the next published records each have one payload byte altered
    truncate: int = 0  # the next published records each lose their last half
    foreign_layout: int = 0  # the next published records each claim another layout (their header still checks)
    fired: Counter[str] = attrs.field(factory=Counter)

    def take(self, name: str) -> bool:
        """Whether fault `name` fires now (then one fewer is left, and it is counted in `fired`)."""
        return take_fault(self, name, self.fired)



def _at_least(least: int) -> Validator:
    def check(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"RemoteTierConfig.{attribute.name} must be an integer >= {least:,}, got {value!r}",
                              source="RemoteTierConfig", key=attribute.name)
    return check


def _segment(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    if value != NO_SEGMENT or isinstance(value, bool):
        _at_least(MIN_SEGMENT_BYTES)(_, attribute, value)


def _seconds(_: object, attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"RemoteTierConfig.{attribute.name} must be a finite number of seconds > 0, got {value!r}",
                          source="RemoteTierConfig", key=attribute.name)


def _matches(pattern: re.Pattern[str], example: str) -> Validator:
    def check(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, str) or not pattern.match(value):
            raise ConfigError(f"RemoteTierConfig.{attribute.name} must look like {example!r}, got {value!r}",
                              source="RemoteTierConfig", key=attribute.name)
    return check


def _protocol(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in PROTOCOLS:
        raise ConfigError(f"RemoteTierConfig.protocol must be one of {PROTOCOLS}, got {value!r}",
                          source="RemoteTierConfig", key="protocol")


def _faults(_: object, attribute: attrs.Attribute[RemoteFaults | None], value: object) -> None:
    if value is not None and not isinstance(value, RemoteFaults):
        raise ConfigError(f"RemoteTierConfig.faults must be None or a RemoteFaults, got {type(value).__name__}",
                          source="RemoteTierConfig", key="faults")


@attrs.frozen(kw_only=True)
class RemoteTierConfig:
    """A Mooncake Store master to share records through (docs/remote.md).  Every field is checked here:
    ConfigError (`source="RemoteTierConfig"`, `key` the field) for a value that cannot work."""

    master: str = attrs.field(validator=_matches(_HOST_PORT, "127.0.0.1:50051"))  # the master's RPC host:port
    metadata: str = attrs.field(validator=_matches(_URL, "http://127.0.0.1:8089/metadata"))
    local_hostname: str = attrs.field(default="127.0.0.1", validator=_matches(re.compile(r"^[A-Za-z0-9_.\-]+$"),
                                                                              "127.0.0.1"))
    protocol: str = attrs.field(default="tcp", validator=_protocol)
    device: str = ""  # the RDMA device names (rdma only)
    namespace: str = attrs.field(default="hkv", validator=_matches(_NAMESPACE, "hkv"))  # key prefix in the store
    # memory this instance lends the store; 0: none (a store process holds the records: they outlive this instance)
    segment_bytes: int = attrs.field(default=64 << 20, validator=_segment)
    buffer_bytes: int = attrs.field(default=16 << 20, validator=_at_least(1 << 20))
    staging_bytes: int = attrs.field(default=16 << 20, validator=_at_least(1 << 16))
    deadline_s: float = attrs.field(default=0.5, validator=_seconds)  # a lookup or get slower than this: a miss
    retry_s: float = attrs.field(default=1.0, validator=_seconds)  # unavailable this long after a failure
    zero_copy: bool = True  # register the staging arena: put_from / get_into (else plain put / get)
    workers: int = attrs.field(default=4, validator=_at_least(1))
    faults: RemoteFaults | None = attrs.field(default=None, validator=_faults)
