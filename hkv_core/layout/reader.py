"""Typed, validating reads from a config mapping; every failure is a ``ConfigError``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NoReturn

from hkv_core.errors import ConfigError


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
        """An int ``>= minimum`` (bools are not ints here)."""
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"must be an int, got {value!r}")
        if value < minimum:
            self.fail(key, f"must be >= {minimum}, got {value}")
        return value

    def boolean(self, key: str, *, default: bool | None = None) -> bool:
        """A bool."""
        value = self._get(key, default)
        if not isinstance(value, bool):
            self.fail(key, f"must be a bool, got {value!r}")
        return value

    def string(self, key: str, *, default: str | None = None) -> str:
        """A str."""
        value = self._get(key, default)
        if not isinstance(value, str):
            self.fail(key, f"must be a string, got {value!r}")
        return value

    def int_list(self, key: str, *, minimum: int = 0) -> list[int]:
        """A non-empty list of ints ``>= minimum``."""
        result: list[int] = []
        for index, item in enumerate(self._list(key)):
            if isinstance(item, bool) or not isinstance(item, int) or item < minimum:
                self.fail(key, f"entry {index} must be an int >= {minimum}, got {item!r}")
            result.append(item)
        return result

    def string_list(self, key: str) -> list[str]:
        """A non-empty list of strings."""
        result: list[str] = []
        for index, item in enumerate(self._list(key)):
            if not isinstance(item, str):
                self.fail(key, f"entry {index} must be a string, got {item!r}")
            result.append(item)
        return result

    def _list(self, key: str) -> list[object]:
        value = self._get(key, None)
        if not isinstance(value, list | tuple) or not value:
            self.fail(key, f"must be a non-empty list, got {value!r}")
        return list(value)

    def table(self, key: str) -> ConfigReader:
        """A nested mapping (empty if missing), read with ``key.`` as the message prefix."""
        value = self._get(key, {})
        if not isinstance(value, Mapping):
            self.fail(key, f"must be a table, got {value!r}")
        return ConfigReader(value, source=self.source, prefix=f"{self.prefix}{key}.")
