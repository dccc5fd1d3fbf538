"""RemoteTierConfig's checks, and every way of reaching no master: a typed error, nothing started or leaked."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import needs_mooncake
from remote_helpers import threads

from hkv_core.errors import ConfigError, InvalidArgument, MissingDependency, TierError
from hkv_exec_ref import Engine, RemoteTierConfig
from hkv_tiers import mooncake_client, remote_store
from hkv_tiers.mooncake_master import MooncakeMaster, free_port

GOOD = {"master": "127.0.0.1:50051", "metadata": "http://127.0.0.1:8089/metadata"}


@pytest.mark.parametrize("key, value", [
    ("master", "127.0.0.1"), ("master", "http://127.0.0.1:1"), ("master", 50051),
    ("metadata", "127.0.0.1:8089/metadata"), ("metadata", ""),
    ("protocol", "udp"), ("segment_bytes", 1024), ("segment_bytes", 8 << 20), ("segment_bytes", True),
    ("buffer_bytes", -1),
    ("staging_bytes", 1.5), ("deadline_s", 0), ("deadline_s", float("nan")), ("retry_s", -1.0),
    ("workers", 0), ("namespace", "a/b"), ("namespace", ""), ("faults", "slow"), ("local_hostname", "a b"),
])
def test_a_bad_field_is_a_config_error_naming_it(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as raised:
        RemoteTierConfig(**{**GOOD, key: value})
    assert raised.value.fields["key"] == key and raised.value.fields["source"] == "RemoteTierConfig"


def test_the_defaults_are_valid() -> None:
    config = RemoteTierConfig(**GOOD)
    assert config.protocol == "tcp" and config.zero_copy and config.deadline_s > 0


def test_an_engine_refuses_a_random_key_seed_or_another_type_before_connecting() -> None:
    with pytest.raises(ConfigError, match="same fixed key_seed") as raised:
        Engine.tiny(0, key_seed=None, remote=RemoteTierConfig(**GOOD))
    assert raised.value.fields["key"] == "key_seed"
    with pytest.raises(InvalidArgument, match="RemoteTierConfig"):
        Engine.tiny(0, remote=GOOD)  # type: ignore[arg-type]


def test_without_the_client_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mooncake.store", None)  # import fails as if not installed
    with pytest.raises(MissingDependency) as raised:
        mooncake_client.store_class()
    assert raised.value.extra == "remote" and "mooncake" in raised.value.package


@needs_mooncake
def test_no_master_at_the_address_is_a_tier_error_at_once_and_nothing_is_left(tmp_path: Path) -> None:
    before = threads()
    config = RemoteTierConfig(master=f"127.0.0.1:{free_port()}", metadata=f"http://127.0.0.1:{free_port()}/m")
    began = time.monotonic()
    with pytest.raises(TierError) as raised:
        Engine.tiny(0, key_seed=1, remote=config, disk_dir=tmp_path / "cache")
    assert time.monotonic() - began < 5 and raised.value.tier == "remote" and "no Mooncake master" in str(raised.value)
    assert threads() <= before
    Engine.tiny(0, key_seed=1, disk_dir=tmp_path / "cache").close()  # the directory was not left claimed


@needs_mooncake
def test_a_master_that_exits_at_once_is_a_tier_error(tmp_path: Path) -> None:
    master = MooncakeMaster(tmp_path / "log")
    master.binary = Path("/bin/false")  # exits with status 1 before listening
    with pytest.raises(TierError) as raised:
        master.start()
    assert raised.value.tier == "remote" and "exit code 1" in raised.value.reason and not master.running


@needs_mooncake
def test_an_engine_refused_after_connecting_leaves_no_client_open(master: MooncakeMaster, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[Any] = []

    class Counted:  # the real client, its close noted
        def __init__(self, client: Any) -> None:
            self.client = client
            opened.append(self)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.client, name)

        def close(self) -> None:
            opened.remove(self)
            self.client.close()

    real = remote_store.connect
    monkeypatch.setattr(remote_store, "connect", lambda config: Counted(real(config)))
    first = Engine.tiny(0, key_seed=1, disk_dir=tmp_path / "cache", remote=master.config())
    with pytest.raises(TierError, match="in use by another cache"):
        Engine.tiny(0, key_seed=1, disk_dir=tmp_path / "cache", remote=master.config())
    assert len(opened) == 1  # only the first engine's
    first.close()
    assert opened == []
