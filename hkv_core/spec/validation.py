"""Load `specs/validation.toml`: the four hit-validation layers and their reason codes."""

from __future__ import annotations

from pathlib import Path

import attrs

from hkv_core.errors import SpecError
from hkv_core.spec.toml_fields import TableReader, read_toml
from hkv_core.spec_paths import specs_dir

LAYER_NAMES = ("whole_block", "kernel_abi", "multi_group", "byte_alignment")  # the four layers, in the order applied
REASON_KINDS = frozenset({"shorten", "reject", "rule"})


@attrs.frozen(kw_only=True)
class ReasonSpec:
    """One reason code of a validation layer: what it does to a hit (shorten, reject, rule) and why."""

    code: str
    layer: str
    kind: str
    description: str


@attrs.frozen(kw_only=True)
class ValidationLayerSpec:
    """One hit-validation layer: its name, its place in the order, and its reason codes."""

    name: str
    order: int
    description: str
    reasons: tuple[ReasonSpec, ...]


@attrs.frozen(kw_only=True)
class ValidationSpec:
    """The whole `specs/validation.toml`: the four layers in order."""

    source: str
    layers: tuple[ValidationLayerSpec, ...]

    @property
    def codes(self) -> dict[str, ReasonSpec]:
        """Every reason code, mapped to its record."""
        return {r.code: r for layer in self.layers for r in layer.reasons}


def load_validation(path: Path | str | None = None) -> ValidationSpec:
    """Load and validate the hit-validation spec (the shipped one by default)."""
    file_path = Path(path) if path is not None else specs_dir() / "validation.toml"
    root = TableReader(str(file_path), "", read_toml(file_path))
    root.only({"layers"})
    table = root.sub("layers")
    if tuple(table.data) != LAYER_NAMES:
        raise table.fail("*", f"expected exactly the layers {LAYER_NAMES} in that order")
    layers = tuple(_layer(table.sub(name), name) for name in LAYER_NAMES)
    if [layer.order for layer in layers] != [1, 2, 3, 4]:
        raise table.fail("order", "layers must be ordered 1..4 as listed")
    codes = [r.code for layer in layers for r in layer.reasons]
    if len(set(codes)) != len(codes):
        raise table.fail("reasons", "reason codes must be unique across layers")
    return ValidationSpec(source=str(file_path), layers=layers)


def _layer(table: TableReader, name: str) -> ValidationLayerSpec:
    table.only({"order", "description", "reasons"})
    raw = table.raw("reasons")
    if not isinstance(raw, list) or not raw:
        raise table.fail("reasons", "expected a non-empty list of reason tables")
    reasons = []
    for index, item in enumerate(raw):
        entry = TableReader(table.file, f"{table.table}.reasons[{index}]", item)
        entry.only({"code", "kind", "description"})
        code, kind = entry.str_("code"), entry.str_("kind")
        if not code.isupper() or not code.replace("_", "").isalnum():
            raise entry.fail("code", f"reason codes are UPPER_SNAKE_CASE, got {code!r}")
        if kind not in REASON_KINDS:
            raise entry.fail("kind", f"expected one of {sorted(REASON_KINDS)}, got {kind!r}")
        reasons.append(ReasonSpec(code=code, layer=name, kind=kind, description=entry.str_("description")))
    return ValidationLayerSpec(name=name, order=table.int_("order", minimum=1),
                               description=table.str_("description"), reasons=tuple(reasons))


__all__ = ["LAYER_NAMES", "ReasonSpec", "SpecError", "ValidationLayerSpec", "ValidationSpec",
           "load_validation"]
