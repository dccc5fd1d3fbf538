"""DeepSeek-V3.2 (`deepseek_v32`): MLA's latent plus one lightning-indexer key per token and layer, two per-token
kinds in their own pools that a hit, a copy-on-write and a tier record carry together."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_hf_configs import fixture, kinds, layout_of

from hkv_core.errors import ConfigError
from hkv_core.layout import Layout, ObjectKind
from hkv_core.layout.presets import load_preset_config
from hkv_core.manager import CacheManager, ManagerConfig, check_invariants
from hkv_core.plan import Completion

LATENT, KEY = "full.compressed_kv", "full.indexer_state.keys"


def test_the_fixture_keeps_a_latent_and_an_indexer_key_per_token_and_layer() -> None:
    layout = layout_of("deepseek_v32")
    assert (layout.family, layout.model_type, layout.head_dim) == ("mla", "deepseek_v32", 576)
    assert kinds(layout) == [("FULL", 1, 61, 0), ("FULL", 1, 1, 0)]
    assert all(g.has_indexer and (g.index_n_heads, g.index_head_dim, g.index_topk) == (64, 128, 2048)
               for g in layout.all_groups)
    assert [(p.object_kind, p.entry_shape) for p in layout.pools] == [
        (ObjectKind.COMPRESSED_KV, (576,)), (ObjectKind.INDEXER_STATE, (128,))]  # no indexer tail: nothing compresses
    assert layout.bytes_per_token(ObjectKind.COMPRESSED_KV) == 61 * 576 * 2
    assert layout.bytes_per_token(ObjectKind.INDEXER_STATE) == 61 * 128 * 2
    assert Layout.from_preset("deepseek_v32") == Layout.from_hf_config(fixture("deepseek_v32"), name="deepseek_v32",
                                                                       block_tokens=64)


def test_the_indexer_is_the_one_transformers_configures() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(**fixture("deepseek_v32"))
    assert set(config.layer_types) == {"indexed_attention"}  # transformers: every layer is DSA
    group = layout_of("deepseek_v32").group("full")
    assert (group.index_n_heads, group.index_head_dim, group.index_topk) == (
        config.index_n_heads, config.index_head_dim, config.index_topk)
    assert group.layer_count == len(config.layer_types)


@pytest.mark.parametrize(("change", "key", "words"), [
    ({"index_head_dim": None}, "index_head_dim", "missing"),
    ({"index_topk": 0}, "index_topk", "must be in"),
    ({"compress_ratios": [4] * 61}, "compress_ratios", "deepseek_v4"),
    ({"sliding_window": 128}, "sliding_window", "no sliding-window layers"),
])
def test_a_v32_config_missing_its_indexer_or_carrying_foreign_keys_is_refused(change: dict[str, Any], key: str,
                                                                                words: str) -> None:
    with pytest.raises(ConfigError, match=words) as info:
        Layout.from_hf_config({**fixture("deepseek_v32"), **change}, name="v32")
    assert info.value.key == key


def test_deepseek_v3_still_refuses_an_indexer() -> None:
    with pytest.raises(ConfigError, match="deepseek_v32") as info:
        Layout.from_hf_config({**fixture("deepseek_v3"), "index_topk": 2048}, name="v3")
    assert info.value.key == "index_topk"


def test_a_hit_holds_and_copies_both_kinds() -> None:
    """A resume inside a page (4,096-byte pages hold 64 latent and 128 indexer tokens; blocks are 8): the hit
    leases the latent's and the indexer's pages alike, and the first allocation copies each kind's partial
    page (copy-on-write) before the request writes past it."""
    config = load_preset_config("tiny_v32")
    config["hkv"] = {**config["hkv"], "alignment_bytes": 4096}
    m = CacheManager(Layout.from_hf_config(config, name="tiny_v32"), ManagerConfig(
        default_pool_pages=16, key_seed=3, retain_every_blocks=1))
    block = m.layout.block_tokens
    assert {p.name: p.tokens_per_page for p in m.layout.pools} == {LATENT: 64, KEY: 128}
    prompt = np.arange(5 * block + 3) % 60
    first = m.add_request(prompt)
    m.acquire(first, m.match(first))
    m.allocate(first, len(prompt))
    m.commit(first, len(prompt))
    m.release(first)
    again = m.add_request(np.concatenate([prompt[:3 * block], [61, 62]]))
    hit = m.match(again)
    assert hit.tokens == 3 * block, hit
    assert set(hit.pages) == {LATENT, KEY} and len(hit.pages[LATENT]) == len(hit.pages[KEY]) == 1
    m.acquire(again, hit)
    alloc = m.allocate(again, 2)
    assert alloc.plan is not None
    copies = {op.pool: op.entries for op in alloc.plan.ops}
    assert copies == {LATENT: 3 * block, KEY: 3 * block}  # each kind's first 24 entries, copied on write
    m.complete(alloc.plan.plan_id, Completion())
    m.commit(again, 2)
    m.release(again)
    assert check_invariants(m) == []


def test_a_config_transformers_saved_reads_as_the_published_one() -> None:
    """DeepseekV32Config.to_dict() adds layer_types (every layer indexed_attention) and head_dim: the same
    layout; other layer types are refused by name."""
    transformers = pytest.importorskip("transformers")
    saved = transformers.AutoConfig.for_model(**fixture("deepseek_v32")).to_dict()
    assert set(saved["layer_types"]) == {"indexed_attention"}
    assert Layout.from_hf_config(saved, name="v32") == Layout.from_hf_config(fixture("deepseek_v32"), name="v32")
    for types in (["indexed_attention"] * 60, ["full_attention"] * 61):
        with pytest.raises(ConfigError, match="indexed_attention") as info:
            Layout.from_hf_config({**fixture("deepseek_v32"), "layer_types": types}, name="v32")
        assert info.value.key == "layer_types"


def test_recompute_is_priced_as_sparse_attention_far_into_a_context() -> None:
    """The cost model's FLOPs: at 100k tokens a V3.2 token attends to its indexer's 2,048 picks (plus the
    scoring), far fewer than DeepSeek-V3's every earlier token."""
    from hkv_core.tiers.cost import recompute_flops

    v32, v3 = layout_of("deepseek_v32"), layout_of("deepseek_v3")
    assert recompute_flops(v32, 100_000, 100_064) < 0.5 * recompute_flops(v3, 100_000, 100_064)
    assert recompute_flops(v32, 0, 64) > recompute_flops(v3, 0, 64)  # short contexts: the scoring costs extra
