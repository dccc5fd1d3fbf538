"""Read model configs: presets (``specs/presets/NAME.toml``) and HF ``config.json`` files.

A preset holds Hugging Face style top-level keys plus an optional ``[hkv]``
table (``block_tokens``, ``alignment_bytes``).  Configs are returned as plain
dicts; ``Layout.from_hf_config`` validates them.
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from hkv_core.errors import ConfigError, SpecError
from hkv_core.layout.bounds import CONFIG_FILE_BYTES_MAX
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
    """The dict of a ``config.json`` (or ``.toml``) file; a directory means its config.json.

    ConfigError for a path that is missing or not a regular file, a file over CONFIG_FILE_BYTES_MAX (checked
    before reading), one that cannot be read or parsed (nested too deeply included), or whose top level is
    not an object.
    """
    if path.is_dir():
        path = path / CONFIG_FILE_NAME
    text = _read_config_bytes(path)
    try:
        config = tomllib.loads(text.decode("utf-8")) if path.suffix == PRESET_SUFFIX else json.loads(text)
    except ValueError as err:  # TOMLDecodeError, JSONDecodeError, UnicodeDecodeError, an int too long to convert
        raise ConfigError(f"cannot parse: {err}", source=str(path), key="<file>") from err
    except RecursionError:
        raise ConfigError("cannot parse: nested too deeply", source=str(path), key="<file>") from None
    if not isinstance(config, dict):
        raise ConfigError("top level must be an object", source=str(path), key="<root>")
    return config


def _read_config_bytes(path: Path) -> bytes:
    """The bytes of config file `path`: a regular file of at most CONFIG_FILE_BYTES_MAX bytes, else ConfigError."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        raise ConfigError("no such config file", source=str(path), key="path") from None
    except OSError as err:
        raise ConfigError(f"cannot read: {err.strerror or err}", source=str(path), key="path") from None
    if not stat.S_ISREG(status.st_mode):
        raise ConfigError("not a regular file", source=str(path), key="path")
    limit = CONFIG_FILE_BYTES_MAX
    too_large = f"more than {limit:,} bytes (CONFIG_FILE_BYTES_MAX, docs/models.md); not a model config"
    if status.st_size > limit:
        raise ConfigError(f"{status.st_size:,} bytes, {too_large}", source=str(path), key="path")
    try:
        with path.open("rb") as handle:
            data = handle.read(limit + 1)  # the file may have grown since stat
    except OSError as err:
        raise ConfigError(f"cannot read: {err.strerror or err}", source=str(path), key="path") from None
    if len(data) > limit:
        raise ConfigError(too_large, source=str(path), key="path")
    return data


def config_name(path: Path) -> str:
    """A model name for a config file: its directory's name for ``config.json``, else the stem."""
    if path.is_dir():
        return path.resolve().name
    if path.name == CONFIG_FILE_NAME and path.resolve().parent.name:
        return path.resolve().parent.name
    return path.stem
