"""A Mooncake Store master on loopback, started and stopped by hkv (tests, `hkv demo --remote`, benchmarks).

`MooncakeMaster()` picks three free loopback ports (RPC, HTTP metadata, metrics), `start()` runs
`mooncake_master` (from the `remote` extra: next to the Python interpreter, else on PATH) and waits until its
RPC and metadata ports accept connections; `stop()` ends it, `start()` again brings it back on the same ports
(its objects are gone: a restarted master knows nothing).  `config(**overrides)` is the RemoteTierConfig that
reaches it.  With `store_bytes`, a store process (mooncake_store.py: Mooncake's standalone client) holds that
much of the store, started after the master and stopped before it, and `config` lends no instance memory
(`segment_bytes=0`): records outlive the instance that published them.  It never listens anywhere but
127.0.0.1.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from hkv_core.errors import TierError
from hkv_tiers.mooncake_client import end_process, listening, remote_binary, spawn
from hkv_tiers.mooncake_store import MooncakeStoreProcess
from hkv_tiers.remote_config import RemoteTierConfig

HOST = "127.0.0.1"
BINARY = "mooncake_master"
START_TIMEOUT_S = 20.0


def master_binary() -> Path:
    """The `mooncake_master` executable; MissingDependency without the remote extra."""
    return remote_binary(BINARY, "a local Mooncake master")


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class MooncakeMaster:
    """One `mooncake_master` process on loopback ports (see the module docstring)."""

    def __init__(self, log_path: str | Path | None = None, store_bytes: int = 0) -> None:
        self.binary = master_binary()
        self.rpc_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        self.log_path = Path(log_path) if log_path is not None else None
        self.process: subprocess.Popen[bytes] | None = None
        store_log = self.log_path.with_name(self.log_path.stem + "_store.log") if self.log_path else None
        self.store = (MooncakeStoreProcess(self.address, self.metadata, store_bytes, free_port(), store_log)
                      if store_bytes else None)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.rpc_port}"

    @property
    def metadata(self) -> str:
        return f"http://{HOST}:{self.http_port}/metadata"

    def config(self, **overrides: Any) -> RemoteTierConfig:
        """The RemoteTierConfig of an instance using this master (lending no memory when a store process
        holds the store)."""
        lend = {"segment_bytes": 0} if self.store is not None else {}
        return RemoteTierConfig(master=self.address, metadata=self.metadata, **{**lend, **overrides})

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> MooncakeMaster:
        """Run the master and wait until it serves; TierError (tier "remote") when it exits or never listens."""
        if self.running:
            return self
        argv = [str(self.binary), f"--rpc_address={HOST}", f"--rpc_port={self.rpc_port}",
                "--enable_http_metadata_server=true", f"--http_metadata_server_host={HOST}",
                f"--http_metadata_server_port={self.http_port}", f"--metrics_port={self.metrics_port}"]
        self.process = spawn(argv, self.log_path)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (listening(HOST, self.rpc_port) and listening(HOST, self.http_port)):
            if self.process.poll() is not None or time.monotonic() > deadline:
                code = self.process.poll()
                self.stop()
                raise TierError(tier="remote", record=self.address, reason=f"mooncake_master did not start "
                                f"(exit code {code}, ports {self.rpc_port}/{self.http_port})")
            time.sleep(0.02)
        if self.store is not None:
            try:
                self.store.start()
            except TierError:
                self.stop()
                raise
        return self

    def stop(self) -> None:
        """End the store process, then the master (SIGTERM, then SIGKILL after 5 s); nothing when it is not
        running."""
        if self.store is not None:
            self.store.stop()
        end_process(self.process)
        self.process = None

    def __enter__(self) -> MooncakeMaster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
