"""Connecting to a Mooncake Store master: the `remote` extra's client, checked before it is used.

`connect(config)` imports `mooncake.store` (MissingDependency naming the extra, or the system libraries the
wheel needs, when it cannot), makes sure a master answers at `config.master` first (the client's own setup
would wait 90 s for one that is not there), and sets the client up, its transfer engine listening on
`config.local_hostname` (MC_TCP_BIND_ADDRESS, unless set) and its calls to the master giving up after 5 s
(MC_RPC_TIMEOUT_MS, unless set; Mooncake's default is 30 s); TierError (tier "remote") when it refuses.  The
client logs errors only (MC_LOG_LEVEL=ERROR, unless set).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from hkv_core.errors import MissingDependency, TierError
from hkv_tiers.remote_config import RemoteTierConfig

LOG_LEVEL_ENV = "GLOG_minloglevel"  # glog's own spelling: 1 keeps warnings and errors (read at process start)
MOONCAKE_LOG_ENV = "MC_LOG_LEVEL"  # the Mooncake client's own log level (read when it starts logging)
RPC_TIMEOUT_ENV = "MC_RPC_TIMEOUT_MS"  # how long one client call waits for the master (Mooncake's default: 30 s)
RPC_TIMEOUT_MS = "5000"  # hkv's default: deadlines bound the serving thread, this bounds the workers and close()
BIND_ENV = "MC_TCP_BIND_ADDRESS"  # where the client's transfer engine listens (else: the first active interface)
SYSTEM_LIBRARIES = "libibverbs1 librdmacm1 libnuma1"  # what the Mooncake wheel links against (apt packages)


def listening(host: str, port: int, timeout_s: float = 0.2) -> bool:
    """Something accepts TCP connections at host:port."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def remote_binary(name: str, action: str) -> Path:
    """An executable of the remote extra (`mooncake_master`, `mooncake_client`): beside the Python interpreter,
    else on PATH; MissingDependency without the extra."""
    beside = Path(sys.executable).parent / name
    found = beside if beside.exists() else shutil.which(name)
    if found is None:
        raise MissingDependency(package=f"mooncake-transfer-engine-non-cuda ({name})", extra="remote", action=action)
    return Path(found)


def spawn(argv: list[str], log_path: Path | None) -> subprocess.Popen[bytes]:
    """Start a helper process, its output appended to `log_path` (or dropped), glog at warnings unless set."""
    log = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL  # noqa: SIM115
    env = {**os.environ, LOG_LEVEL_ENV: os.environ.get(LOG_LEVEL_ENV, "1")}
    try:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    finally:
        if log is not subprocess.DEVNULL:
            log.close()  # type: ignore[union-attr]


def end_process(process: subprocess.Popen[bytes] | None) -> None:
    """End a helper process (SIGTERM, then SIGKILL after 5 s) and reap it; nothing when it already ended."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def store_class() -> Any:
    """`mooncake.store.MooncakeDistributedStore`; MissingDependency without the extra or its system libraries."""
    os.environ.setdefault(MOONCAKE_LOG_ENV, "ERROR")  # unless the embedding engine says otherwise: errors only
    try:
        from mooncake.store import MooncakeDistributedStore  # type: ignore[import-not-found,unused-ignore]
    except ImportError as err:
        package = (f"the system libraries {SYSTEM_LIBRARIES} (apt-get install)" if ".so" in str(err)
                   else "mooncake-transfer-engine-non-cuda")
        raise MissingDependency(package=package, extra="remote", action="the remote tier") from err
    return MooncakeDistributedStore


def connect(config: RemoteTierConfig) -> Any:
    """A Mooncake Store client set up against `config`'s master (see the module docstring)."""
    cls = store_class()
    host, port = config.master.rsplit(":", 1)
    if not listening(host, int(port), timeout_s=min(config.deadline_s, 2.0)):
        raise TierError(tier="remote", record=config.master, reason="no Mooncake master answers there")
    os.environ.setdefault(BIND_ENV, config.local_hostname)  # listen where it says it is: loopback in tests
    os.environ.setdefault(RPC_TIMEOUT_ENV, RPC_TIMEOUT_MS)
    client = cls()
    rc = client.setup(config.local_hostname, config.metadata, config.segment_bytes, config.buffer_bytes,
                      config.protocol, config.device, config.master)
    if rc != 0:
        raise TierError(tier="remote", record=config.master, reason=f"the Mooncake client's setup returned {rc}")
    return client
