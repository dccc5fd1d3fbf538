"""The validation spec loads with its four layers; malformed variants are rejected."""

from pathlib import Path

import pytest

from hkv_core.errors import SpecError
from hkv_core.spec.validation import LAYER_NAMES, load_validation
from hkv_core.spec_paths import specs_dir


def test_four_layers_in_order_with_unique_codes() -> None:
    spec = load_validation()
    assert tuple(layer.name for layer in spec.layers) == LAYER_NAMES
    assert all(layer.reasons for layer in spec.layers)
    assert {"PARTIAL_BLOCK", "ABI_MISMATCH", "WINDOW_MISSING", "MISALIGNED_PAGE"} <= set(spec.codes)


@pytest.mark.parametrize(("old", "new", "key"), [
    ('code = "ABI_MISMATCH"', 'code = "abi mismatch"', "code"),
    ('kind = "reject"', 'kind = "maybe"', "kind"),
    ("[layers.kernel_abi]", "[layers.kernel_abj]", "*"),
    ('code = "TAIL_MISSING"', 'code = "PARTIAL_BLOCK"', "reasons"),
    ("order = 2", "order = 7", "order"),
])
def test_malformed_validation_spec(tmp_path: Path, old: str, new: str, key: str) -> None:
    text = (specs_dir() / "validation.toml").read_text()
    assert old in text
    path = tmp_path / "validation.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(SpecError) as info:
        load_validation(path)
    assert info.value.key == key and info.value.file == str(path)
