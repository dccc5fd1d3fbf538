"""Records outlive the instance that published them when a store process holds the store's memory.

Instance A (its own process) serves a prompt, publishes its records and exits; instance B, a process started
only after A's has ended, serves A's prefix from the remote tier, bit-exact.  Without the store process (A
lends its own segment, the default), the same sequence leaves B nothing: the control that shows the test can
see the difference.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import MISSING
from remote_helpers import KEY_SEED, prompt

from hkv_core.errors import ConfigError, TierError
from hkv_exec_ref.demo.remote_demo import InstanceProcess
from hkv_tiers.mooncake_master import MooncakeMaster
from hkv_tiers.mooncake_store import MooncakeStoreProcess
from hkv_tiers.remote_config import RemoteTierConfig

ENGINE = {"seed": 0, "key_seed": KEY_SEED, "load_policy": "load"}
STORE_BYTES = 64 << 20


@pytest.fixture
def store_master(tmp_path: Path) -> Iterator[MooncakeMaster]:
    if MISSING:
        pytest.skip(MISSING)
    with MooncakeMaster(tmp_path / "master.log", store_bytes=STORE_BYTES) as running:
        yield running


def serve_then_exit(config: RemoteTierConfig, tokens: np.ndarray, log: Path) -> dict:
    """One instance process serves `tokens` and exits (status 0); its answer."""
    instance = InstanceProcess(config, ENGINE, log)
    try:
        answer = instance.ask({"prompt": tokens.tolist(), "max_new_tokens": 4, "salt": None})
    finally:
        assert instance.close() == 0
    assert instance.process.poll() == 0  # ended before the next one starts
    return answer


def test_b_started_after_a_exited_serves_a_prefix_bit_exact(store_master: MooncakeMaster, tmp_path: Path) -> None:
    assert store_master.config().segment_bytes == 0  # instances lend nothing: the store process holds it all
    head = prompt(301)[:80]
    first = serve_then_exit(store_master.config(), head, tmp_path / "a.log")
    assert first["exact"] and first["cached_by_tier"]["remote"] == 0
    second = serve_then_exit(store_master.config(), head, tmp_path / "b.log")
    assert second["cached_by_tier"]["remote"] == 64  # every block but the one holding the last prompt token
    assert second["exact"] and second["logits_digest"] == first["logits_digest"]
    assert second["tokens"] == first["tokens"]


def test_without_a_store_process_the_records_leave_with_their_publisher(master: MooncakeMaster,
                                                                        tmp_path: Path) -> None:
    head = prompt(302)[:80]
    first = serve_then_exit(master.config(), head, tmp_path / "a.log")
    second = serve_then_exit(master.config(), head, tmp_path / "b.log")
    assert first["exact"] and second["exact"] and second["cached_by_tier"]["remote"] == 0


def test_a_store_process_needs_a_mountable_segment_and_an_instance_lends_none_or_enough() -> None:
    with pytest.raises(TierError, match="at least"):
        MooncakeStoreProcess("127.0.0.1:1", "http://127.0.0.1:2/metadata", 1 << 20, port=3)
    with pytest.raises(ConfigError) as err:
        RemoteTierConfig(master="127.0.0.1:1", metadata="http://127.0.0.1:2/metadata", segment_bytes=1 << 20)
    assert err.value.key == "segment_bytes"
    assert RemoteTierConfig(master="127.0.0.1:1", metadata="http://127.0.0.1:2/metadata", segment_bytes=0)
