"""Typed, validating reads from a config mapping; every failure is a ``ConfigError``.

Every integer is checked against its upper limit in ``bounds.py`` as it is
read, and every list's length before its entries, so nothing oversized is
ever iterated or built.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import NoReturn

from hkv_core.errors import ConfigError
from hkv_core.layout.bounds import LAYER_LIST_ITEMS_MAX, key_maximum


class ConfigReader:
    """Reads keys of one config mapping, naming ``source`` and the key in every error.

    A key whose value is ``None`` (JSON ``null``) counts as missing.  ``prefix``
    qualifies keys of a nested table in messages (``hkv.block_tokens``).
    """

    def __init__(self, config: Mapping[str, object], *, source: str, prefix: str = "") -> None:
        self.config, self.source, self.prefix = config, source, prefix

    def fail(self, key: str, message: str) -> NoReturn:
        """Raise ``ConfigError`` for ``key``."""
        raise ConfigError(message, source=self.source, key=self.prefix + key)

    def _get(self, key: str, default: object) -> object:
        value = self.config.get(key)
        if value is None:
            if default is None:
                self.fail(key, "missing required key")
            return default
        return value

    def integer(self, key: str, *, minimum: int = 0, default: int | None = None) -> int:
        """An int in ``[minimum, key_maximum(key)]`` (bools are not ints here)."""
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"must be an int, got {reprlib.repr(value)}")
        self._check_range(key, value, minimum)
        return value

    def _check_range(self, key: str, value: int, minimum: int, what: str = "") -> None:
        maximum = key_maximum(key)
        if not minimum <= value <= maximum:
            self.fail(key, f"{what}must be in [{minimum}, {maximum}] (hkv's limit), got {value}")

    def boolean(self, key: str, *, default: bool | None = None) -> bool:
        """A bool."""
        value = self._get(key, default)
        if not isinstance(value, bool):
            self.fail(key, f"must be a bool, got {reprlib.repr(value)}")
        return value

    def string(self, key: str, *, default: str | None = None) -> str:
        """A str."""
        value = self._get(key, default)
        if not isinstance(value, str):
            self.fail(key, f"must be a string, got {reprlib.repr(value)}")
        return value

    def int_list(self, key: str, *, minimum: int = 0) -> list[int]:
        """A non-empty per-layer list of ints in ``[minimum, key_maximum(key)]``."""
        result: list[int] = []
        for index, item in enumerate(self._list(key)):
            if isinstance(item, bool) or not isinstance(item, int):
                self.fail(key, f"entry {index} must be an int, got {reprlib.repr(item)}")
            self._check_range(key, item, minimum, f"entry {index} ")
            result.append(item)
        return result

    def string_list(self, key: str) -> list[str]:
        """A non-empty per-layer list of strings."""
        result: list[str] = []
        for index, item in enumerate(self._list(key)):
            if not isinstance(item, str):
                self.fail(key, f"entry {index} must be a string, got {reprlib.repr(item)}")
            result.append(item)
        return result

    def _list(self, key: str) -> list[object]:
        value = self._get(key, None)
        if not isinstance(value, list | tuple) or not value:
            self.fail(key, f"must be a non-empty list, got {reprlib.repr(value)}")
        if len(value) > LAYER_LIST_ITEMS_MAX:
            self.fail(key, f"has {len(value)} entries; at most {LAYER_LIST_ITEMS_MAX} (hkv's limit)")
        return list(value)

    def present(self, key: str) -> bool:
        """True when ``key`` is given with a value other than ``None``."""
        return self.config.get(key) is not None

    def table(self, key: str) -> ConfigReader:
        """A nested mapping (empty if missing), read with ``key.`` as the message prefix."""
        value = self._get(key, {})
        if not isinstance(value, Mapping):
            self.fail(key, f"must be a table, got {reprlib.repr(value)}")
        return ConfigReader(value, source=self.source, prefix=f"{self.prefix}{key}.")
