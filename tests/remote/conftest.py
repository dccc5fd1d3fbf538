"""Fixtures of the remote tier's tests: a Mooncake master on free loopback ports, started and stopped here.

Every test here needs the `remote` extra (Mooncake's client and `mooncake_master`) and the system libraries
its wheel links against; `scripts/setup_remote.sh` (run by the test command) installs them.  Without them each
test skips, saying what is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hkv_core.errors import MissingDependency
from hkv_tiers.mooncake_client import store_class
from hkv_tiers.mooncake_master import MooncakeMaster


def _missing() -> str:
    try:
        store_class()
        MooncakeMaster()
    except MissingDependency as err:
        return f"the remote tier's tests need {err.package} (pip install 'hkv[remote]'; scripts/setup_remote.sh)"
    return ""


MISSING = _missing()
needs_mooncake = pytest.mark.skipif(bool(MISSING), reason=MISSING)


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MooncakeMaster]:
    """One master for a module's tests (each uses its own prompts, so they do not see each other's records)."""
    if MISSING:
        pytest.skip(MISSING)
    with MooncakeMaster(tmp_path_factory.mktemp("master") / "master.log") as running:
        yield running


@pytest.fixture
def own_master(tmp_path: Path) -> Iterator[MooncakeMaster]:
    """A master for one test (it may stop and restart it)."""
    if MISSING:
        pytest.skip(MISSING)
    running = MooncakeMaster(tmp_path / "master.log").start()
    try:
        yield running
    finally:
        running.stop()
