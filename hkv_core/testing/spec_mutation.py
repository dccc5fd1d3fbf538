"""Build deliberately broken spec variants from the shipped spec (for tests).

A variant is the shipped `lifecycle.toml` text with one exact substring
replaced, written to a new file; a replacement that matches nothing is an
error so a test can never silently test the unbroken spec.
"""

from __future__ import annotations

from pathlib import Path

from hkv_core.spec.loader import default_lifecycle_path


def mutated_spec(directory: Path, old: str, new: str, count: int = 1) -> Path:
    """Write the shipped spec with `old` replaced by `new` (exactly `count` times)."""
    text = default_lifecycle_path().read_text()
    found = text.count(old)
    assert found >= count, f"mutation target {old!r} found {found} times, wanted {count}"
    path = directory / "lifecycle.toml"
    path.write_text(text.replace(old, new, count))
    return path
