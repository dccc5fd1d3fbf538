"""Where the spec data (``lifecycle.toml``, ``validation.toml``, ``presets/``) lives.

In a source checkout the specs sit in the repository's ``specs/`` directory,
beside the ``hkv_core`` package.  An installed wheel carries a copy of that
directory as ``hkv_core/_specs`` (see ``[tool.hatch.build.targets.wheel.force-include]``
in ``pyproject.toml``).  ``specs_dir()`` is the one place that knows this.
"""

from __future__ import annotations

from pathlib import Path

from hkv_core.errors import SpecError

__all__ = ["presets_dir", "specs_dir"]

INSTALLED_SPECS_NAME = "_specs"
REPOSITORY_SPECS_NAME = "specs"


def specs_dir() -> Path:
    """Return the directory holding the spec files.

    Prefers the installed copy ``hkv_core/_specs``; falls back to the
    repository's ``specs/`` directory.  Raises ``SpecError`` if neither exists.
    """
    package_dir = Path(__file__).resolve().parent  # hkv_core/ (this module lives at its top)
    installed = package_dir / INSTALLED_SPECS_NAME
    if installed.is_dir():
        return installed
    repository = package_dir.parent / REPOSITORY_SPECS_NAME
    if repository.is_dir():
        return repository
    raise SpecError(
        f"no spec directory: looked for {installed} and {repository}",
        file=str(repository),
        table="-",
        key="specs_dir",
    )


def presets_dir() -> Path:
    """Return the directory of model layout presets (``<specs>/presets``)."""
    return specs_dir() / "presets"
