"""A tier cache's directory: one cache per directory (a lock), and whose cache it is (`cache.json`).

`cache.json` holds the layout fingerprint, a model id (the weights the records
were computed with) and the key seed the records' block keys were made with;
it is written durably when the directory is new, and a directory that holds
another layout's or model's cache, or keys of another seed, is refused with a
ConfigError: its records would be another model's bytes.  The lock
(`fcntl.flock` on `lock`) keeps a second cache out while one is open; a
process death releases it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

from hkv_core.errors import ConfigError, InvalidArgument, TierError

META_FILE, LOCK_FILE, RECORDS_DIR = "cache.json", "lock", "records"
META_FORMAT = 1  # cache.json's own format


class CacheDirectory:
    """The locked directory of one cache (`release` lets it go)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory
        try:
            if directory.exists() and not directory.is_dir():  # mkdir would say "File exists" (/dev/null)
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(directory))
            directory.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise TierError(tier="disk", record=str(directory), reason=f"cannot open the directory: "
                            f"{err.strerror}", errno=err.errno) from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.release()
            raise TierError(tier="disk", record=str(directory), reason="the directory is in use by another "
                            "cache (its lock is held)") from None

    def claim(self, layout_fingerprint: str, model_id: str, key_seed: int) -> None:
        """Write the cache's identity (a new directory) or check it (ConfigError when it is another's)."""
        path = self.path / META_FILE
        want = {"format": META_FORMAT, "layout_fingerprint": layout_fingerprint, "model_id": model_id,
                "key_seed": key_seed}
        if not path.exists():
            if any((self.path / RECORDS_DIR).glob("*")):
                raise ConfigError("records without the cache.json that says whose they are: refusing to serve "
                                  "them", source=str(path), key="cache.json")
            temp = path.with_suffix(".tmp")
            with open(temp, "w") as f:
                json.dump(want, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, path)
            fd = os.open(self.path, os.O_RDONLY)  # the rename durable before any record is written
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            return
        have = _read(path)
        for field in ("layout_fingerprint", "model_id", "key_seed"):
            if have.get(field) != want[field]:
                raise ConfigError(f"this directory holds a cache of {field} {have.get(field)!r}, not "
                                  f"{want[field]!r}", source=str(path), key=field)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def checked_directory(directory: object, *, action: str, argument: str) -> Path | None:
    """`directory` as a Path (None stays None); InvalidArgument for anything but a non-empty str or PathLike
    (an empty string would silently mean the current working directory)."""
    if directory is None:
        return None
    if not isinstance(directory, str | os.PathLike) or not str(os.fspath(directory)).strip():
        raise InvalidArgument(action=action, argument=argument, value=directory,
                              reason="must be None or a non-empty path of a directory (\"\" would be the current "
                                     "working directory)")
    return Path(directory)


def stored_key_seed(directory: str | Path | None) -> int | None:
    """The key seed a cache directory's records were keyed with (None when it holds no cache yet)."""
    path = Path(directory) / META_FILE if directory is not None else None
    if path is None or not path.exists():
        return None
    seed = _read(path).get("key_seed")
    return seed if isinstance(seed, int) else None


def _read(path: Path) -> dict[str, object]:
    """cache.json's object; ConfigError when it cannot be read or is not a JSON object."""
    try:
        have = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"unreadable ({err})", source=str(path), key="cache.json") from None
    if not isinstance(have, dict):
        raise ConfigError(f"not a JSON object but {type(have).__name__}", source=str(path), key="cache.json")
    return have
