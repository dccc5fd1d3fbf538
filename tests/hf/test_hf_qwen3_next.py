"""transformers' Qwen3-Next (Gated DeltaNet + gated full attention) served through hkv (issue 26, item 4).

The layout is `Layout.from_hf_config` of the model's own config object; `HybridServer` serves it with every
call's state read from hkv's pools (K / V rows from the full layers' block pages, each Gated DeltaNet layer's
convolution and recurrent state from the snapshot at the hit, copied on write) and rebuilt into HF's
`DynamicCache`.  What it serves equals HF's own run, keeping its own cache, over the same call boundaries, bit
for bit: at every block, with chunked prefill, through evictions and from the host tier.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the hf extra (transformers, torch) is not installed")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

from hkv_core.layout import Layout, ObjectKind  # noqa: E402
from hkv_core.manager import CacheManager, ManagerConfig, check_invariants  # noqa: E402
from hkv_exec_ref.executor import RefExecutor  # noqa: E402
from hkv_exec_ref.hf.qwen3_next import HfQwen3Next, tiny_qwen3_next  # noqa: E402
from hkv_exec_ref.tiny_linear import HybridServer  # noqa: E402
from hkv_tiers.link import TierOptions  # noqa: E402

BLOCK = 8
BASE = np.random.default_rng(3).integers(0, 64, 48)


@functools.cache
def model() -> HfQwen3Next:
    return HfQwen3Next(tiny_qwen3_next(0))


def server(*, pages: int = 64, broken: bool = False, tiers: TierOptions | None = None) -> HybridServer:
    layout = Layout.from_hf_config(model().model.config, name="hf_qwen3_next")
    manager = CacheManager(layout, ManagerConfig(default_pool_pages=pages, retain_every_blocks=1, key_seed=4))
    return HybridServer(model(), manager, RefExecutor(), skip_state_copy=broken, tiers=tiers)


def reference(prompt: np.ndarray, hit: int, chunk: int | None) -> np.ndarray:
    """HF's own run over the calls the server made: every block boundary, and the ends of its chunks."""
    cuts = set(range(BLOCK, len(prompt), BLOCK)) | (set(range(hit, len(prompt), chunk)) if chunk else set())
    return model().chunked(prompt, sorted(cuts))


def test_the_layout_is_read_from_the_model_config() -> None:
    layout = Layout.from_hf_config(model().model.config, name="hf_qwen3_next")
    assert [(g.kind.value, g.layer_ids) for g in layout.groups] == [("FULL", (1, 3)), ("LINEAR", (0, 2))]
    state = {p.entry_kind.value: p.entry_shape for p in layout.pools if p.object_kind is ObjectKind.RECURRENT_STATE}
    assert state == {"conv_state": (2 * 2 * 8 + 4 * 8, 3), "ssm_state": (4, 8, 8)}  # HF keeps (64, 4) and (4, 8, 8)


@pytest.mark.parametrize("shared", [8, 19, 24, 40])
@pytest.mark.parametrize("chunk", [None, 5])
def test_served_equals_hfs_own_chunked_run_after_a_hit(shared: int, chunk: int | None) -> None:
    srv = server()
    first = srv.prefill(BASE)
    assert np.array_equal(first.logits, reference(BASE, 0, None))
    prompt = np.concatenate([BASE[:shared], [7, 8, 9]])
    served = srv.prefill(prompt, chunk_tokens=chunk)
    assert served.cached_tokens == shared // BLOCK * BLOCK
    assert np.array_equal(served.logits, reference(prompt, served.cached_tokens, chunk)[served.cached_tokens:])
    assert check_invariants(srv.manager) == []


def test_through_evictions_and_from_the_host_tier(tmp_path: Path) -> None:
    srv = server(pages=24, tiers=TierOptions(directory=tmp_path, host_bytes=1 << 20, policy="load"))
    srv.prefill(BASE)
    srv.manager.evict()
    prompt = np.concatenate([BASE[:37], [1]])
    served = srv.prefill(prompt)
    assert (served.cached_tokens, served.tier_tokens) == (32, 32)
    assert np.array_equal(served.logits, reference(prompt, 32, None)[32:])
    srv.close()


def test_broken_variant_without_copy_on_write_is_caught() -> None:
    srv = server(broken=True)
    srv.prefill(BASE)
    srv.prefill(np.arange(40) % 64)
    prompt = np.concatenate([BASE[:24], [5, 6]])
    served = srv.prefill(prompt)
    assert served.cached_tokens == 24
    assert not np.array_equal(served.logits, reference(prompt, 24, None)[24:])
