"""`vllm serve` on the tiny Qwen3-Next (a Gated DeltaNet layer: vLLM's Mamba group) through hkv_vllm.Scheduler.

As test_serve.py does for the tiny Llama: the server in a process group of its own on a free port, the `openai`
client, everything stopped whatever happens.  The block is set to 96 tokens (vLLM raises a smaller one until its
page holds the linear layer's state: to 96 on one host, to 64 on another); a 300-token system prompt is three
blocks, which the second and third chats resume from.
"""

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.vllm_plugin.conftest import HAS_VLLM, SKIP_REASON
from tests.vllm_plugin.test_serve import (
    CHAT_TEMPLATE,
    ENV,
    ROOT,
    START_TIMEOUT_S,
    _cached,
    _free_port,
    _healthy,
    _stop,
    _tail,
)

pytestmark = pytest.mark.skipif(not HAS_VLLM, reason=SKIP_REASON)
NAME = "tiny-qwen3-next"
SYSTEM = " ".join(f"t{i}" for i in range(300))


@pytest.fixture(scope="module")
def hybrid_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from hkv_vllm.tiny_qwen3_next import write_tiny_qwen3_next

    vllm = Path(sys.executable).with_name("vllm")
    if not vllm.exists():
        pytest.skip(f"no vllm command beside {sys.executable}")
    tmp = tmp_path_factory.mktemp("serve-hybrid")
    model = write_tiny_qwen3_next(tmp / NAME, seed=0)
    (tmp / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    port, log = _free_port(), tmp / "server.log"
    command = [str(vllm), "serve", str(model), "--scheduler-cls", "hkv_vllm.Scheduler", "--host", "127.0.0.1",
               "--port", str(port), "--served-model-name", NAME, "--dtype", "bfloat16", "--enforce-eager",
               "--block-size", "96", "--num-gpu-blocks-override", "40", "--max-model-len", "1024",
               "--max-num-seqs", "4", "--chat-template", str(tmp / "chat_template.jinja"),
               "--enable-prompt-tokens-details", "--seed", "0"]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    started, base = time.monotonic(), f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **ENV, "PYTHONPATH": path}, cwd=tmp, start_new_session=True)
    try:
        while not _healthy(base):
            if proc.poll() is not None or time.monotonic() - started > START_TIMEOUT_S:
                pytest.fail(f"`vllm serve` of {NAME} not healthy (exit {proc.poll()}); log {log}:\n" + _tail(log))
            time.sleep(0.25)
        yield base
    finally:
        _stop(proc)


def test_chats_resume_from_the_cached_state_and_answer_as_before(hybrid_server: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{hybrid_server}/v1", api_key="unused", timeout=120, max_retries=0)
    replies = [client.chat.completions.create(
        model=NAME, messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        max_tokens=8, temperature=0.0) for question in ("t1 t2 t3", "t4 t5 t6", "t1 t2 t3")]
    assert [_cached(r.usage) for r in replies] == [0, 288, 288]  # three 96-token blocks, state and KV
    assert replies[2].choices[0].message.content == replies[0].choices[0].message.content  # greedy: same answer
    assert replies[1].choices[0].message.content != replies[0].choices[0].message.content
