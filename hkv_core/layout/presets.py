"""Read model configs: presets (``specs/presets/NAME.toml``) and HF ``config.json`` files.

A preset holds Hugging Face style top-level keys plus an optional ``[hkv]``
table (``block_tokens``, ``alignment_bytes``).  Configs are returned as plain
dicts; ``Layout.from_hf_config`` validates them.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from hkv_core.errors import ConfigError, SpecError
from hkv_core.spec_paths import presets_dir

PRESET_SUFFIX = ".toml"
CONFIG_FILE_NAME = "config.json"


def preset_names() -> tuple[str, ...]:
    """Names of the available presets, sorted."""
    directory = presets_dir()
    if not directory.is_dir():
        return ()
    return tuple(sorted(path.stem for path in directory.glob(f"*{PRESET_SUFFIX}")))


def load_preset_config(name: str) -> dict[str, Any]:
    """The raw config dict of preset ``name``; ``ConfigError`` lists the presets if unknown."""
    names = preset_names()
    if name not in names:
        raise ConfigError(f"unknown preset {name!r}; available: {', '.join(names) or 'none'}",
                          source=name, key="preset")
    path = presets_dir() / f"{name}{PRESET_SUFFIX}"
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as err:
        raise SpecError(str(err), file=str(path), table="-", key="toml") from err


def load_config_file(path: Path) -> dict[str, Any]:
    """The dict of a ``config.json`` (or ``.toml``) file; a directory means its config.json."""
    if path.is_dir():
        path = path / CONFIG_FILE_NAME
    if not path.is_file():
        raise ConfigError("no such config file", source=str(path), key="path")
    try:
        if path.suffix == PRESET_SUFFIX:
            with path.open("rb") as handle:
                return tomllib.load(handle)
        config = json.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot parse: {err}", source=str(path), key="<file>") from err
    if not isinstance(config, dict):
        raise ConfigError("top level must be an object", source=str(path), key="<root>")
    return config


def config_name(path: Path) -> str:
    """A model name for a config file: its directory's name for ``config.json``, else the stem."""
    if path.is_dir():
        return path.resolve().name
    if path.name == CONFIG_FILE_NAME and path.resolve().parent.name:
        return path.resolve().parent.name
    return path.stem
