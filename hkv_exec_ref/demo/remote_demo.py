"""`hkv demo --remote`: two serving instances in two processes share one Mooncake Store master.

A local master is started on loopback with a store process (Mooncake's standalone client) holding the
store's memory, so records outlive the instance that published them; instances A and B (each
`remote_instance.py` in its own process, with its own device pools, the same layout, weights and key seed)
serve the built-in workload in arrival order, requests alternating between them as a round-robin router would
send them.  A session's next turn therefore usually lands on the other instance, which finds the prefix its
peer computed in the shared store, loads it (checked) and serves it; every response is checked against a full
recomputation in its own process.
"""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import attrs

from hkv_core.errors import TierError
from hkv_exec_ref.demo.workload import WorkloadConfig, generate_trace, prompt_tokens
from hkv_tiers.mooncake_master import MooncakeMaster
from hkv_tiers.remote_config import RemoteTierConfig

INSTANCES = ("A", "B")
REMOTE_LIMITS: dict[str, Any] = {"default_pool_pages": 160, "retain_every_blocks": 2}
STORE_BYTES = 256 << 20  # the store process's segment: the records outlive the instances (docs/remote.md)
ANSWER_TIMEOUT_S = 120.0


class InstanceProcess:
    """A serving instance in a child process (remote_instance.py), driven one JSON line at a time."""

    def __init__(self, remote: RemoteTierConfig, engine: dict[str, Any], log: Path | None = None) -> None:
        fields = attrs.asdict(remote, filter=lambda a, _: a.name != "faults")
        job = json.dumps({"remote": fields, "engine": engine})
        stderr: IO[bytes] | int = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.process = subprocess.Popen([sys.executable, "-m", "hkv_exec_ref.demo.remote_instance", job],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                            text=True)
        finally:
            if not isinstance(stderr, int):
                stderr.close()

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request, return its answer; TierError (tier "remote") when the instance failed."""
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # it ended: its last line says why
        ready, _, _ = select.select([self.process.stdout], [], [], ANSWER_TIMEOUT_S)  # one line per request
        if not ready:
            self.process.kill()
            raise TierError(tier="remote", record="instance", reason=f"no answer within {ANSWER_TIMEOUT_S:.0f} s")
        line = self.process.stdout.readline()
        answer: dict[str, Any] = json.loads(line) if line else {"error": "exited", "message": "no answer"}
        if "error" in answer:
            raise TierError(tier="remote", record="instance", reason=f"{answer['error']}: {answer['message']}")
        return answer

    def close(self) -> int:
        """End of input: the instance closes its engine and exits; its exit status."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


@attrs.frozen(kw_only=True)
class RemoteDemoReport:
    """What each instance served, from which tier, and whether every response was exact."""

    requests: int
    per_instance: dict[str, dict[str, int]]  # instance -> requests, prompt_tokens, exact, tokens per tier
    exact_matches: int
    mismatches: tuple[int, ...]
    remote_counts: dict[str, dict[str, int]]  # instance -> the remote tier's counters
    master: str
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.mismatches and self.exact_matches == self.requests

    def to_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        out["mismatches"], out["ok"] = list(self.mismatches), self.ok
        return out


def run_remote_demo(cfg: WorkloadConfig, *, progress: Callable[[int], None] | None = None,
                    log_dir: Path | None = None, load_policy: str = "cost") -> RemoteDemoReport:
    """Serve the workload alternately on two instances sharing a local master (see the module docstring)."""
    trace = generate_trace(cfg)
    began = time.perf_counter()
    with MooncakeMaster(log_dir / "mooncake_master.log" if log_dir else None, store_bytes=STORE_BYTES) as master:
        engine = {"seed": cfg.seed, "key_seed": cfg.seed, "load_policy": load_policy, **REMOTE_LIMITS}
        instances = {name: InstanceProcess(master.config(), engine, log_dir / f"instance_{name}.log"
                                           if log_dir else None) for name in INSTANCES}
        totals = {name: Counter[str]() for name in INSTANCES}
        mismatches: list[int] = []
        try:
            for i, record in enumerate(trace):
                name = INSTANCES[i % len(INSTANCES)]
                answer = instances[name].ask({"prompt": prompt_tokens(record, cfg).tolist(),
                                              "max_new_tokens": record.output_length})
                totals[name].update(requests=1, prompt_tokens=record.input_length, exact=int(answer["exact"]),
                                    **{f"from_{t}": n for t, n in answer["cached_by_tier"].items()})
                mismatches += [] if answer["exact"] else [i]
                if progress is not None:
                    progress(i + 1)
            counts = {name: p.ask({"report": True})["report"]["remote"]["counts"] for name, p in instances.items()}
        finally:
            for process in instances.values():
                process.close()
    return RemoteDemoReport(requests=len(trace), per_instance={n: dict(c) for n, c in totals.items()},
                            exact_matches=sum(c["exact"] for c in totals.values()), mismatches=tuple(mismatches),
                            remote_counts=counts, master=master.address,
                            seconds=round(time.perf_counter() - began, 3))
