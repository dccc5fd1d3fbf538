"""The command line's exit statuses and the typed errors only the command line raises.

Exit statuses (docs/cli.md lists them per command):

- 0 (`OK`): the command did what it was asked and found nothing wrong;
- 1 (`FAILED`): the command ran and found a problem: `hkv check` found a
  violated invariant, `hkv demo` served a response that differs from
  recomputation;
- 2 (`USAGE`): the input was refused before or while running: a bad option
  value, an unreadable or malformed file, an output path that cannot be
  written (every `HkvError` ends here, with its type, message and fields);
- 3 (`TRUNCATED`): `hkv check` reached its state cap before exploring the
  whole bound and found no violation in what it explored: no verdict;
- 70 (`INTERNAL`): an unexpected exception, that is a bug in hkv (one line
  names it; `HKV_TRACEBACK=1` prints the traceback);
- 130 (`INTERRUPTED`): Ctrl-C.

When the reader of stdout goes away (`hkv ... | head -1`) the command stops
quietly with status 1, as click ends any command whose output pipe closed.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from hkv_core.errors import HkvError

OK = 0
FAILED = 1
USAGE = 2
TRUNCATED = 3
INTERNAL = 70
INTERRUPTED = 130


class OutputPathError(HkvError):
    """An output path of a command (its ``option``, e.g. ``--out``) cannot be created or written.

    ``path`` is the file or folder that failed, ``reason`` the system's words
    and ``errno`` its error number (``None`` when not from the system).
    """

    def __init__(self, reason: str, *, option: str, path: str, errno: int | None) -> None:
        super().__init__(f"{option} {path}: cannot write: {reason}", option=option, path=path, reason=reason,
                         errno=errno)
        self.option, self.path, self.reason, self.errno = option, path, reason, errno


@contextmanager
def writing(option: str, path: Path) -> Iterator[None]:
    """Turn an OSError raised while creating or writing `path` into an OutputPathError naming `option`."""
    try:
        yield
    except OSError as err:
        where = str(err.filename) if err.filename is not None else str(path)
        reason = err.strerror or str(err)
        raise OutputPathError(reason, option=option, path=where, errno=err.errno) from None


def output_folder(option: str, path: Path) -> Path:
    """Create the folder `path` (and its parents) for `option`; OutputPathError when that is impossible."""
    with writing(option, path):
        with suppress(FileExistsError):  # something that is no folder (/dev/null): say so, not "File exists"
            path.mkdir(parents=True, exist_ok=True)
        if not path.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
    return path


def writable_folder(option: str, path: Path) -> Path:
    """`output_folder`, then a file made and removed in it: OutputPathError now, not after a long run."""
    folder = output_folder(option, path)
    with writing(option, folder):
        tempfile.TemporaryFile(dir=folder).close()
    return folder
