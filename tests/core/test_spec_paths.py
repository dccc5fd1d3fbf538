"""specs_dir(): installed hkv_core/_specs first, then the repository's specs/, else SpecError."""

from __future__ import annotations

from pathlib import Path

import pytest

from hkv_core import spec_paths
from hkv_core.errors import SpecError
from hkv_core.spec_paths import presets_dir, specs_dir


def test_repository_specs_in_a_checkout() -> None:
    assert (specs_dir() / "lifecycle.toml").is_file()
    assert presets_dir() == specs_dir() / "presets"


def test_lookup_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "hkv_core"
    package.mkdir()
    monkeypatch.setattr(spec_paths, "__file__", str(package / "spec_paths.py"))
    with pytest.raises(SpecError) as info:
        specs_dir()
    assert info.value.key == "specs_dir"
    (tmp_path / "specs").mkdir()
    assert specs_dir() == (tmp_path / "specs").resolve()
    (package / "_specs").mkdir()
    assert specs_dir() == (package / "_specs").resolve()
