"""`vllm serve MODEL --scheduler-cls hkv_vllm.Scheduler`, as docs/vllm.md writes it, on the tiny local Llama.

Starts the server (the `vllm` command of this interpreter's environment, .venv-vllm) on a free port of
127.0.0.1, waits for /health, then talks to it with the `openai` client (a vLLM dependency): chat and plain
completions, each twice with a shared prefix so the second resumes from hkv's cache, and a bad request
(400) after which the server still serves.  The server and everything it started are stopped whatever
happens (SIGTERM to its process group, SIGKILL after a timeout).  It starts in 21-36 s on two cores.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.vllm_plugin.conftest import HAS_VLLM, SKIP_REASON

pytestmark = pytest.mark.skipif(not HAS_VLLM, reason=SKIP_REASON)

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 240  # 21-25 s on two idle cores, 36 s seen with them shared; CI's may be busier
STOP_TIMEOUT_S = 30
MODEL_NAME = "tiny-llama"
# the tiny tokenizer has no chat template: each message's words, in order
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
# the engine settings hkv_vllm.e2e uses on CPU (ENGINE_ENV, e2e_run.engine_args), in a process of its own
ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1",
       "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
BLOCK = 32
SYSTEM = " ".join(f"t{i}" for i in range(96))  # three blocks shared by both requests of a pair


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(log: Path, lines: int = 40) -> str:
    text = log.read_text(errors="replace").splitlines() if log.exists() else []
    return "\n".join(text[-lines:])


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (the API server, its engine core, its worker), SIGKILL to what is
    left after STOP_TIMEOUT_S; the group is its own (start_new_session), so nothing else is signalled."""
    def signal_group(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)

    signal_group(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        signal_group(signal.SIGKILL)
        proc.wait(timeout=STOP_TIMEOUT_S)
    deadline = time.monotonic() + STOP_TIMEOUT_S  # the engine core and worker exit after the API server
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    signal_group(signal.SIGKILL)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    from hkv_vllm.tiny_model import write_tiny_llama

    vllm = Path(sys.executable).with_name("vllm")
    if not vllm.exists():
        pytest.skip(f"no vllm command beside {sys.executable}")
    tmp = tmp_path_factory.mktemp("serve")
    model = write_tiny_llama(tmp / "tiny-llama", seed=0)
    template = tmp / "chat_template.jinja"
    template.write_text(CHAT_TEMPLATE)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp / "server.log"
    command = [str(vllm), "serve", str(model), "--scheduler-cls", "hkv_vllm.Scheduler",
               "--host", "127.0.0.1", "--port", str(port), "--served-model-name", MODEL_NAME,
               "--dtype", "float32", "--enforce-eager", "--block-size", str(BLOCK),
               "--num-gpu-blocks-override", "33", "--max-model-len", "512", "--max-num-seqs", "4",
               "--chat-template", str(template), "--enable-prompt-tokens-details", "--seed", "0"]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # this checkout's hkv_vllm
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **ENV, "PYTHONPATH": path}, cwd=tmp, start_new_session=True)
    try:
        while not _healthy(base):
            if proc.poll() is not None:
                pytest.fail(f"`vllm serve` exited {proc.returncode} before /health answered; log {log}:\n"
                            + _tail(log))
            if time.monotonic() - started > START_TIMEOUT_S:
                pytest.fail(f"`vllm serve` gave no healthy /health within {START_TIMEOUT_S} s; log {log}:\n"
                            + _tail(log))
            time.sleep(0.25)
        yield {"base": base, "log": log, "start_s": round(time.monotonic() - started, 1)}
    finally:
        _stop(proc)


def _client(server: dict[str, object]) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{server['base']}/v1", api_key="unused", timeout=60, max_retries=0)


def _cached(usage: Any) -> int:
    """The prompt tokens served from the prefix cache (`--enable-prompt-tokens-details`)."""
    details = usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details is not None else 0


def test_the_server_runs_hkvs_scheduler(server: dict[str, object]) -> None:
    log = Path(str(server["log"])).read_text(errors="replace")
    assert "Using custom scheduler class hkv_vllm.Scheduler" in log, _tail(Path(str(server["log"])))
    print(f"vllm serve healthy after {server['start_s']} s")


def test_chat_completions_share_a_prefix_from_hkvs_cache(server: dict[str, object]) -> None:
    client = _client(server)
    replies = [client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        max_tokens=8, temperature=0.0) for question in ("t1 t2 t3", "t4 t5 t6")]
    for reply in replies:
        assert reply.choices[0].message.content and reply.choices[0].message.content.strip()
        assert reply.usage is not None and reply.usage.completion_tokens == 8
    assert _cached(replies[0].usage) == 0
    assert _cached(replies[1].usage) == 96  # the three shared blocks, from the first request


def test_completions_share_a_prefix_and_a_bad_request_leaves_the_server_serving(server: dict[str, object]) -> None:
    from openai import BadRequestError

    client = _client(server)
    prefix = " ".join(f"t{i}" for i in range(200, 264))  # two blocks no other test sends
    first, second = (client.completions.create(model=MODEL_NAME, prompt=f"{prefix} {tail}", max_tokens=8,
                                               temperature=0.0) for tail in ("t7", "t8 t9"))
    for reply in (first, second):
        assert reply.choices[0].text.strip() and reply.usage is not None
    assert (_cached(first.usage), _cached(second.usage)) == (0, 64)
    with pytest.raises(BadRequestError) as err:  # longer than max_model_len: vLLM's front end refuses it
        client.completions.create(model=MODEL_NAME, prompt=[5] * 600, max_tokens=4)
    assert err.value.status_code == 400
    again = client.completions.create(model=MODEL_NAME, prompt=f"{prefix} t7", max_tokens=8, temperature=0.0)
    assert again.choices[0].text == first.choices[0].text  # greedy, and now a hit: the same answer
    assert _cached(again.usage) == 64
    with urllib.request.urlopen(f"{server['base']}/metrics", timeout=10) as reply:
        metrics = reply.read().decode()
    hits = [line for line in metrics.splitlines() if line.startswith("vllm:prefix_cache_hits_total")]
    assert hits and float(hits[0].rsplit(" ", 1)[1]) >= 96 + 64 + 64, json.dumps(hits)
