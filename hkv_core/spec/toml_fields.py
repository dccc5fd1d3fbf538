"""Typed field readers for TOML tables that raise SpecError naming file, table and key."""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hkv_core.errors import SpecError


class TableReader:
    """Reads typed fields out of one TOML table; every failure names file/table/key, and the object kind
    when the table belongs to one (`kind`: a kind's table and the tables inside it)."""

    def __init__(self, file: str, table: str, data: object, kind: str | None = None) -> None:
        if not isinstance(data, Mapping):
            raise SpecError("expected a table", file=file, table=table, key="*", kind=kind)
        self.file, self.table, self.data, self.kind = file, table, data, kind

    def fail(self, key: str, message: str) -> SpecError:
        """A SpecError at `key` of this table."""
        return SpecError(message, file=self.file, table=self.table, key=key, kind=self.kind)

    def only(self, allowed: set[str]) -> None:
        """Reject keys outside `allowed` (typos must not pass silently)."""
        for key in self.data:
            if key not in allowed:
                raise self.fail(str(key), f"unknown key (allowed: {', '.join(sorted(allowed))})")

    def raw(self, key: str) -> object:
        if key not in self.data:
            raise self.fail(key, "missing required key")
        return self.data[key]

    def str_(self, key: str, default: str | None = None) -> str:
        if default is not None and key not in self.data:
            return default
        value = self.raw(key)
        if not isinstance(value, str) or not value:
            raise self.fail(key, f"expected a non-empty string, got {value!r}")
        return value

    def int_(self, key: str, minimum: int = 0) -> int:
        value = self.raw(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self.fail(key, f"expected an integer >= {minimum}, got {value!r}")
        return value

    def strs(self, key: str, default: tuple[str, ...] | None = None) -> tuple[str, ...]:
        if default is not None and key not in self.data:
            return default
        value = self.raw(key)
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.fail(key, f"expected a list of non-empty strings, got {value!r}")
        if len(set(value)) != len(value):
            raise self.fail(key, f"duplicate entries in {value!r}")
        return tuple(value)

    def sub(self, key: str, kind: str | None = None) -> TableReader:
        """The table at `key`; it belongs to object kind `kind` if given, else to this table's kind."""
        return TableReader(self.file, f"{self.table}.{key}" if self.table else key, self.raw(key),
                           kind if kind is not None else self.kind)


MAX_SPEC_BYTES = 4 << 20  # a spec file's size limit; the shipped lifecycle spec is about 20 KB


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a spec file: missing, not a regular file (a FIFO or a device would block or never end), larger
    than MAX_SPEC_BYTES, unreadable, not UTF-8 or not TOML raise SpecError naming the file."""
    def fail(why: str) -> SpecError:
        return SpecError(why, file=str(path), table="", key="*")

    try:
        status = os.stat(path)
        if not stat.S_ISREG(status.st_mode):
            raise fail("not a regular file")
        if status.st_size > MAX_SPEC_BYTES:
            raise fail(f"larger than {MAX_SPEC_BYTES:,} bytes")
        with path.open("rb") as handle:
            data = handle.read(MAX_SPEC_BYTES + 1)  # the file may have grown since stat
        if len(data) > MAX_SPEC_BYTES:
            raise fail(f"larger than {MAX_SPEC_BYTES:,} bytes")
        return tomllib.loads(data.decode("utf-8"))
    except FileNotFoundError:
        raise fail("file not found") from None
    except OSError as err:
        raise fail(f"cannot read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise fail(f"not UTF-8 text (byte {err.start}): {err.reason}") from None
    except tomllib.TOMLDecodeError as exc:
        raise fail(f"invalid TOML: {exc}") from exc
