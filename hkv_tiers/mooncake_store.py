"""A Mooncake store process: Mooncake's standalone client (`mooncake_client`) holding the store's memory.

An instance that lends its own memory to the store (`RemoteTierConfig.segment_bytes` > 0) takes the records
placed there with it when it closes: its segment unmounts.  `MooncakeStoreProcess` runs Mooncake's own
standalone client, which mounts a segment of `store_bytes` and does nothing else; instances then lend none
(`segment_bytes=0`), so every record they publish lives in the store process and stays after its publisher
exits (docs/remote.md, "Records that outlive their publisher").  It listens on loopback only.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from hkv_core.errors import TierError
from hkv_tiers.mooncake_client import end_process, listening, remote_binary, spawn

HOST = "127.0.0.1"
BINARY = "mooncake_client"  # the remote extra's standalone client (Mooncake 0.3.x: real_client_main)
START_TIMEOUT_S = 20.0
MIN_STORE_BYTES = 16 << 20  # the smallest segment Mooncake mounts


def store_binary() -> Path:
    """The `mooncake_client` executable; MissingDependency without the remote extra."""
    return remote_binary(BINARY, "a Mooncake store process")


class MooncakeStoreProcess:
    """`mooncake_client` holding `store_bytes` of the store behind master `master` (see the module docstring)."""

    def __init__(self, master: str, metadata: str, store_bytes: int, port: int,
                 log_path: str | Path | None = None) -> None:
        if isinstance(store_bytes, bool) or not isinstance(store_bytes, int) or store_bytes < MIN_STORE_BYTES:
            raise TierError(tier="remote", record="store", reason=f"a store process holds at least "
                            f"{MIN_STORE_BYTES:,} bytes, got {store_bytes!r}")
        self.binary = store_binary()
        self.master, self.metadata, self.store_bytes, self.port = master, metadata, store_bytes, port
        self.log_path = Path(log_path) if log_path is not None else None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> MooncakeStoreProcess:
        """Run it and wait until its service port accepts connections (its segment is mounted by then);
        TierError (tier "remote") when it exits or never listens."""
        if self.running:
            return self
        argv = [str(self.binary), f"--master_server_address={self.master}", f"--metadata_server={self.metadata}",
                f"--host={HOST}", f"--port={self.port}", f"--global_segment_size={self.store_bytes}",
                "--protocol=tcp"]
        self.process = spawn(argv, self.log_path)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not listening(HOST, self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                code = self.process.poll()
                self.stop()
                raise TierError(tier="remote", record="store", reason=f"mooncake_client did not start (exit "
                                f"code {code}, port {self.port})")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """End it (SIGTERM, then SIGKILL after 5 s): the records it holds are gone."""
        end_process(self.process)
        self.process = None
