"""The repository stands alone: every file its documents and code name exists in it, and nothing outside it is named.

Scanned: every Markdown, Python and TOML file of the repository (virtual environments, caches and build
output left out).  Checked:

- Markdown links `[text](target)` (not URLs or anchors) resolve, from the linking file, to a file or folder
  inside the repository;
- paths under the repository's own folders (`docs/...`, `specs/...`, `benchmarks/...`, `scripts/...`,
  `tests/...`, `hkv_*/...`) exist (a glob must match; an ALL-CAPS placeholder such as `NAME.toml` needs only its
  folder);
- nothing outside is named: no `../` path that leaves the repository, no `../shared` (tests and benchmarks may
  read `../shared/traces`, nothing else), and none of the names of the documents whose content now lives in
  `docs/failures.md` and `docs/v4_cache.md`;
- the README lists every preset in `specs/presets/` (read from the folder, so a new preset fails until listed).

Each check is shown able to fail on a small made-up tree.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import hkv_core

ROOT = Path(hkv_core.__file__).resolve().parent.parent
SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis",
             "build", "dist", "out", "node_modules", ".venv-vllm", ".vllm-src", ".vllm-cache"}
SUFFIXES = {".md", ".py", ".toml"}
OWN_FOLDERS = ("docs", "specs", "benchmarks", "scripts", "tests", "hkv_core", "hkv_exec_ref", "hkv_exec_cuda",
               "hkv_cli", "hkv_events", "hkv_vllm")
SELF = Path(__file__).resolve()  # its made-up trees name missing and outside files on purpose
MADE_UP = {  # (file, path) of files a test writes into a temporary tree, not the repository
    ("tests/core/test_import_boundaries.py", "hkv_core/manager/verb.py"),
}
INSTALLED_ONLY = {"hkv_core/_specs"}  # the specs' place inside an installed wheel (hkv_core/spec_paths.py)
OUTSIDE_NAMES = ("FAILURES" + ".md", "V4_CACHE" + ".md")  # spelled in two parts so this file does not name them
SHARED = ".." + "/shared"
SHARED_ALLOWED = (SHARED + "/traces", ("tests", "benchmarks"))  # (prefix, top folders that may use it)

LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
OWN_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(OWN_FOLDERS) + r")/[\w.*/-]*)")
UP_PATH = re.compile(r"(?<![\w.])((?:\.\./)+[\w.*-]+(?:/[\w.*-]+)*)")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(\.\w+)?$")


def scanned_files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and path.suffix in SUFFIXES and path.resolve() != SELF and not any(
                part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts[:-1]):
            yield path


def _exists(root: Path, rel: str) -> bool:
    rel = rel.rstrip("/")
    if rel in INSTALLED_ONLY:
        return True
    if "*" in rel:
        return any(root.glob(rel))
    if (root / rel).exists():
        return True
    parent, _, last = rel.rpartition("/")
    return bool(PLACEHOLDER.match(last)) and (root / parent).is_dir()


def _clean(token: str) -> str:
    return token.lstrip("`'\"(").rstrip("`'\"),.;:")


def _inside(root: Path, path: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


def problems_in(root: Path, path: Path, text: str) -> list[str]:
    """Every reference of `text` (the file `path` of the tree `root`) that is missing or outside."""
    rel_file = path.relative_to(root).as_posix()
    top = path.relative_to(root).parts[0]
    found = []
    for name in OUTSIDE_NAMES:
        if name in text:
            found.append(f"{rel_file}: names {name} (its content is in docs/)")
    for match in re.finditer(re.escape(SHARED), text):
        rest = text[match.start():]
        if not (rest.startswith(SHARED_ALLOWED[0]) and top in SHARED_ALLOWED[1]):
            found.append(f"{rel_file}: names {_clean(rest.split()[0])} outside the repository")
    if path.suffix == ".md":
        for match in LINK.finditer(text):
            target = match.group(1).split("#")[0]
            if not target or re.match(r"^[a-z]+:", target):
                continue
            resolved = path.parent / target
            if not _inside(root, resolved):
                found.append(f"{rel_file}: links {target} outside the repository")
            elif not resolved.exists():
                found.append(f"{rel_file}: links {target}, which does not exist")
    for match in UP_PATH.finditer(text):
        ref = match.group(1).rstrip(".")
        bases = [path.parent] if path.suffix == ".md" else [path.parent, root]
        if not ref.startswith(SHARED) and any(not _inside(root, base / ref) for base in bases):
            found.append(f"{rel_file}: names {ref} outside the repository")
    for match in OWN_PATH.finditer(text):
        ref = match.group(1).rstrip(".")
        if not _exists(root, ref) and (rel_file, ref) not in MADE_UP:
            found.append(f"{rel_file}: names {ref}, which does not exist")
    return found


def scan(root: Path) -> list[str]:
    return [p for path in scanned_files(root) for p in problems_in(root, path, path.read_text(errors="replace"))]


def readme_presets(readme: str) -> list[str]:
    """The presets the README's table lists on its `specs/presets/` row."""
    rows = [line for line in readme.splitlines() if line.startswith("| `specs/presets/` |")]
    assert len(rows) == 1, "the README's table has one specs/presets/ row"
    return re.findall(r"`([\w-]+)`", rows[0].split("|")[2])


def test_every_reference_resolves_inside_the_repository() -> None:
    assert scan(ROOT) == []


def test_the_scan_covers_the_documents_and_the_code() -> None:
    rel = {p.relative_to(ROOT).as_posix() for p in scanned_files(ROOT)}
    assert {"README.md", "docs/design.md", "docs/api.md", "pyproject.toml", "hkv_core/units.py",
            "benchmarks/peer_driver.py", "tests/core/test_import_boundaries.py"} <= rel
    assert "tests/core/test_doc_references.py" not in rel
    assert not any(r.startswith((".venv/", ".git/")) for r in rel)


def test_readme_lists_every_preset() -> None:
    presets = sorted(p.stem for p in (ROOT / "specs" / "presets").glob("*.toml"))
    assert presets, "no presets found"
    assert sorted(readme_presets((ROOT / "README.md").read_text())) == presets


def make_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_the_scan_catches_each_kind_of_bad_reference(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {
        "docs/design.md": "ok",
        "specs/presets/a.toml": "",
        "README.md": ("[design](docs/design.md) [gone](docs/gone.md) [up](../elsewhere.md) see `scripts/none.sh`,"
                      " `specs/presets/*.toml`, `specs/presets/NAME.toml`, `specs/presets/*.json`, and "
                      f"`{SHARED}/peers/bench.py`; {OUTSIDE_NAMES[0]} row F3."),
        "docs/page.md": "[home](../README.md) [design](design.md) `docs/design.md` `../README.md`",
        "tests/test_x.py": f'TRACES = "{SHARED}/traces/a.jsonl"  # allowed here\nOTHER = "{SHARED}/peers/x.py"\n',
        "benchmarks/run.py": f'"""Reads {SHARED}/traces and ../outside/data.json."""\n',
        "hkv_core/mod.py": f'"""See {OUTSIDE_NAMES[1]} and {SHARED}/traces."""\n',
    })
    found = scan(root)
    assert sorted(found) == sorted([
        "README.md: links docs/gone.md, which does not exist",
        "README.md: names docs/gone.md, which does not exist",
        "README.md: links ../elsewhere.md outside the repository",
        "README.md: names ../elsewhere.md outside the repository",
        "README.md: names scripts/none.sh, which does not exist",
        "README.md: names specs/presets/*.json, which does not exist",
        f"README.md: names {SHARED}/peers/bench.py outside the repository",
        f"README.md: names {OUTSIDE_NAMES[0]} (its content is in docs/)",
        f"tests/test_x.py: names {SHARED}/peers/x.py outside the repository",
        "benchmarks/run.py: names ../outside/data.json outside the repository",
        f"hkv_core/mod.py: names {OUTSIDE_NAMES[1]} (its content is in docs/)",
        f"hkv_core/mod.py: names {SHARED}/traces outside the repository",
    ]), "\n".join(sorted(found))


def test_readme_preset_list_is_read_from_its_row() -> None:
    readme = "| path | what |\n| --- | --- |\n| `specs/presets/` | model layouts: `a`, `b_c` |\n"
    assert readme_presets(readme) == ["a", "b_c"]
    with pytest.raises(AssertionError, match="one specs/presets/ row"):
        readme_presets("no table here")
