"""vLLM's own KV cache configurations of DeepSeek-V4-Flash, V4-Pro and V4.1 (hkv_vllm/model_layouts.py).

The group tables are vLLM's planner output for the HF configs in
tests/data/hf_configs/vllm/, checked against the figures the issue states
(each was confirmed against vLLM 0.32 before being written here) and against
vLLM's own functions and spec fields; the V4.1 numbers are checked only
against vLLM's code (its backends' block sizes, its specs' fields, its
planner's rules).

Provenance of the fixtures (hkv keeps them out of tests/data/hf_configs/ itself,
whose files hkv's own config reader must accept): deepseek_v4_flash.json and
deepseek_v4_pro.json are deepseek-ai/DeepSeek-V4-Flash's and -V4-Pro's
config.json as published (key for key, as dumped in public model reports
beside the checkpoints' weight lists, which agree with them: 21 ratio-4 and 20
ratio-128 compressors in Flash, 30 and 31 in Pro; the trimmed
tests/data/hf_configs/deepseek_v4_flash.json agrees on every key it keeps).
deepseek_v41.json is deepseek-ai/DeepSeek-V4.1-Flash's: its text_config as a
public port transcribes it verbatim (a second, independent transcription gives
the same value for every key both hold, but 40 compress_ratios entries where
this one has 43; vLLM reads entries past num_hidden_layers as
sliding-window-only layers either way), and the top-level keys (dtype, token
ids, quantization_config, vision_config) from the second port's copy of the
whole file; the vision tower's keys are the ones vLLM's DeepseekV41Config
reads.
"""

import functools
import json
import math
from collections import Counter
from pathlib import Path

import pytest

from hkv_core.errors import ConfigError
from hkv_vllm.errors import UnsupportedVllmConfig
from tests.vllm_plugin.conftest import HAS_VLLM, SKIP_REASON

pytestmark = pytest.mark.skipif(not HAS_VLLM, reason=SKIP_REASON)

GiB = 1 << 30
HF_CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hf_configs"

# The issue's figures: (spec class, layers, block size, window, bytes per pool block), in vLLM's group order.
FLASH_GROUPS = [
    ("SlidingWindowMLASpec", 22, 64, 128, 823_680),
    ("SlidingWindowMLASpec", 21, 64, 128, 786_240),
    ("MLAAttentionSpec", 62, 256, 0, 1_002_240),
    ("SlidingWindowMLASpec", 42, 4, 8, 870_912),
    ("SlidingWindowMLASpec", 20, 8, 128, 656_640),
]
FLASH_POOL_BLOCK = 1_002_240
PRO_POOL_BLOCK = 1_435_968
# Pro: the same five groups; the issue gives layers and the pool block (91 / 31 + 30 / 60 / 31).
PRO_LAYERS = {("SlidingWindowMLASpec", 64): [31, 30], ("MLAAttentionSpec", 256): [91],
              ("SlidingWindowMLASpec", 4): [60], ("SlidingWindowMLASpec", 8): [31]}


@functools.cache
def layout(model, memory=8 * GiB, **options):
    from hkv_vllm.model_layouts import kv_cache_config

    return kv_cache_config(model, memory_bytes=memory, **options)


def table(lay):
    return [(g.spec, g.layers, g.block_size, g.window, g.page_bytes) for g in lay.groups()]


def hf(model):
    config = json.loads((HF_CONFIGS / "vllm" / f"{model}.json").read_text())
    return config.get("text_config", config)


def layer_specs(lay):
    return {name: spec for group in lay.worker_kv_cache_config.kv_cache_groups
            for name, spec in group.kv_cache_spec.kv_cache_specs.items()}


def kind(name):
    """What a V4 layer name caches: the attention's own compressed KV, its indexer's keys, a compressor state..."""
    for suffix in ("swa_cache", "indexer.k_cache", "indexer.compressor.state_cache", "compressor.state_cache"):
        if name.endswith(suffix):
            return suffix
    return "attn"


def ratio(name):
    return hf("deepseek_v4_flash")["compress_ratios"][int(name.split(".")[2])]


# --- fixtures ---------------------------------------------------------------------------------------------------

def test_flash_fixture_agrees_with_the_trimmed_one_hkv_reads():
    trimmed = json.loads((HF_CONFIGS / "deepseek_v4_flash.json").read_text())
    full = hf("deepseek_v4_flash")
    shared = set(trimmed) & set(full) - {"compress_ratios"}
    assert shared and all(full[key] == trimmed[key] for key in shared)
    assert full["compress_ratios"] == trimmed["compress_ratios"] + [0]  # the published file's MTP entry


@pytest.mark.parametrize(("model", "ratios"), [("deepseek_v4_flash", {0: 2, 4: 21, 128: 20}),
                                               ("deepseek_v4_pro", {4: 30, 128: 31}),
                                               ("deepseek_v41", {0: 2, 2: 18, 1: 20})])
def test_fixtures_hold_the_published_layer_mix(model, ratios):
    config = hf(model)
    assert Counter(config["compress_ratios"][:config["num_hidden_layers"]]) == ratios


# --- DeepSeek-V4-Flash and V4-Pro -------------------------------------------------------------------------------

def test_flash_groups_are_the_issues_table():
    lay = layout("deepseek_v4_flash")
    assert table(lay) == FLASH_GROUPS
    assert lay.pool_block_bytes == FLASH_POOL_BLOCK
    assert all(g.prefix_cacheable and not g.eagle and g.prefix_replay_tokens == 0 for g in lay.groups())


def test_flash_groups_hold_the_layers_the_issue_names():
    lay = layout("deepseek_v4_flash")
    swa_a, swa_b, mla, c4, c128 = (g.layer_names for g in lay.groups())
    mla_kinds = Counter((kind(n), ratio(n)) for n in mla)
    assert mla_kinds == {("attn", 4): 21, ("attn", 128): 20, ("indexer.k_cache", 4): 21}
    assert Counter((kind(n), ratio(n)) for n in c4) == {("compressor.state_cache", 4): 21,
                                                       ("indexer.compressor.state_cache", 4): 21}
    assert Counter((kind(n), ratio(n)) for n in c128) == {("compressor.state_cache", 128): 20}
    # every layer's sliding window cache, even and odd layers apart
    assert sorted(swa_a + swa_b) == sorted(f"model.layers.{i}.attn.swa_cache" for i in range(43))
    assert {int(n.split(".")[2]) % 2 for n in swa_a} == {0} and {int(n.split(".")[2]) % 2 for n in swa_b} == {1}


def test_pro_groups_are_the_issues_table():
    lay = layout("deepseek_v4_pro")
    found: dict[tuple[str, int], list[int]] = {}
    for g in lay.groups():
        found.setdefault((g.spec, g.block_size), []).append(g.layers)
    assert found == PRO_LAYERS
    assert lay.pool_block_bytes == PRO_POOL_BLOCK
    assert max(g.page_bytes for g in lay.groups()) == PRO_POOL_BLOCK  # the MLA group fills the block
    # the other groups' geometry is Flash's: same windows and block sizes, same per-layer pages
    flash = {(g.spec, g.block_size): g for g in layout("deepseek_v4_flash").groups()}
    for g in lay.groups():
        f = flash[(g.spec, g.block_size)]
        assert g.window == f.window
        if g.spec == "SlidingWindowMLASpec":
            assert g.page_bytes // g.layers == f.page_bytes // f.layers


def test_v4_specs_are_the_fp8_ds_mla_records_vllm_layers_publish():
    specs = layer_specs(layout("deepseek_v4_flash"))
    for name, spec in specs.items():
        if kind(name) in ("attn", "swa_cache"):
            assert (spec.cache_dtype_str, spec.state_content_bytes, spec.alignment) == ("fp8_ds_mla", 584, 576)
            assert spec.page_size_bytes == math.ceil(spec.block_size // spec.tokens_per_state * 584 / 576) * 576
        if kind(name) == "attn":
            assert spec.tokens_per_state == ratio(name)
        if kind(name) == "swa_cache":
            assert (spec.block_size, spec.sliding_window, spec.bounded_replay) == (64, 128, False)


@pytest.mark.parametrize("model", ["deepseek_v4_flash", "deepseek_v4_pro"])
def test_v4_block_sizes_are_the_issues(model):
    lay = layout(model)
    sizes = [g.block_size for g in lay.groups()]
    assert lay.scheduler_block_size == math.lcm(*sizes) == 256
    assert lay.hash_block_size == math.gcd(*sizes) == 4  # every group is prefix-cacheable


@pytest.mark.parametrize(("model", "drafter"), [("deepseek_v4_flash", 43), ("deepseek_v4_pro", 61)])
def test_mtp_drafter_joins_a_window_group_that_vllm_marks_eagle(model, drafter):
    plain, mtp = layout(model), layout(model, mtp=True)
    assert len(mtp.groups()) == len(plain.groups()) == 5
    eagle = [g for g in mtp.groups() if g.eagle]
    assert len(eagle) == 1
    assert eagle[0].layer_names[-1] == f"model.layers.{drafter}.attn.swa_cache"  # the drafter's only cache
    added = {n for g in mtp.groups() for n in g.layer_names} - {n for g in plain.groups() for n in g.layer_names}
    assert added == {f"model.layers.{drafter}.attn.swa_cache"}
    assert (eagle[0].spec, eagle[0].block_size, eagle[0].window) == ("SlidingWindowMLASpec", 64, 128)
    assert mtp.pool_block_bytes == plain.pool_block_bytes and mtp.num_blocks == plain.num_blocks
    assert (mtp.scheduler_block_size, mtp.hash_block_size) == (plain.scheduler_block_size, plain.hash_block_size)


def test_flash_mtp_window_groups_split_22_and_22():
    """Flash's 43 + 1 window caches split 22 / 22: the drafter lands in the odd layers' group."""
    swa = [g for g in layout("deepseek_v4_flash", mtp=True).groups() if g.block_size == 64]
    assert [(g.layers, g.page_bytes, g.eagle) for g in swa] == [(22, 823_680, False), (22, 823_680, True)]


# --- DeepSeek-V4.1 ----------------------------------------------------------------------------------------------

def test_v41_bounded_replay_is_vllms_default():
    assert table(layout("deepseek_v41")) == table(layout("deepseek_v41", swa_bounded_replay=True))
    specs = layer_specs(layout("deepseek_v41"))
    assert all(s.bounded_replay for n, s in specs.items() if n.endswith("swa_cache"))


@pytest.mark.parametrize("replay", [True, False])
def test_v41_specs(replay):
    lay = layout("deepseek_v41", swa_bounded_replay=replay)
    specs = layer_specs(lay)
    config = hf("deepseek_v41")
    swa = {n: s for n, s in specs.items() if n.endswith("swa_cache")}
    ring = {n: s for n, s in specs.items() if n.endswith("compressor.state_cache")}
    paged = {n: s for n, s in specs.items() if n not in swa and n not in ring}
    assert sorted(swa) == sorted(f"language_model.model.layers.{i}.attn.swa_cache" for i in range(40))
    for spec in swa.values():
        assert type(spec).__name__ == "SlidingWindowMLASpec"
        assert (spec.block_size, spec.sliding_window, spec.bounded_replay) == (32, config["sliding_window"], replay)
        assert (spec.prefix_cacheable, spec.prefix_replay_tokens) == (not replay, 128 if replay else 0)
        assert spec.uses_slot_mapping
    # the ring: one per ratio-2 KV source (the ratio-1 source, layer 20, pools nothing)
    sources = [i for i in config["kv_source_layer_ids"] if config["compress_ratios"][i] == 2]
    assert sorted(ring) == sorted(f"language_model.model.layers.{i}.attn.compressor.state_cache" for i in sources)
    for spec in ring.values():
        assert type(spec).__name__ == "CircularBufferSpec"
        assert (spec.block_size, spec.prefix_cacheable, spec.uses_slot_mapping) == (8, False, False)
        assert spec.max_num_blocks_per_req(lay.vllm_config, 1 << 20) == 1  # one block per request
    # paged: the KV sources' compressed caches and the index sources' keys they own
    assert Counter(type(s).__name__ for s in paged.values()) == {"MLAAttentionSpec": 8}
    assert {n.rsplit(".", 1)[-1] for n in paged} == {"attn", "k_cache"}
    assert all(s.prefix_cacheable and s.prefix_replay_tokens == 0 for s in paged.values())


def test_v41_paged_block_is_hoppers_flashmla_kernel_block():
    from hkv_vllm.model_layouts import HOPPER, _as_cuda_device

    with _as_cuda_device(HOPPER):
        from vllm.models.deepseek_v41.sparse_mla import DeepseekV4FlashMLABackend

        kernel_block_sizes = DeepseekV4FlashMLABackend.get_supported_kernel_block_sizes()
    paged = [g for g in layout("deepseek_v41").groups() if g.spec == "MLAAttentionSpec"]
    assert len(paged) == 1 and [paged[0].block_size] == kernel_block_sizes


@pytest.mark.parametrize("replay", [True, False])
def test_v41_groups_and_block_sizes(replay):
    lay = layout("deepseek_v41", swa_bounded_replay=replay)
    groups = lay.groups()
    swa = [g for g in groups if g.spec == "SlidingWindowMLASpec"]
    (paged,) = [g for g in groups if g.spec == "MLAAttentionSpec"]
    (ring,) = [g for g in groups if g.spec == "CircularBufferSpec"]
    assert sum(g.layers for g in swa) == 40 and ring.layers == 3 and paged.layers == 8
    # vLLM caps each window group at the paged group's bytes, so the paged group sets the pool block
    assert lay.pool_block_bytes == paged.page_bytes == max(g.page_bytes for g in groups)
    assert all(g.prefix_cacheable == (not replay) and g.prefix_replay_tokens == (128 if replay else 0) for g in swa)
    assert not ring.prefix_cacheable and paged.prefix_cacheable
    assert lay.scheduler_block_size == math.lcm(*(g.block_size for g in groups))
    assert lay.hash_block_size == math.gcd(*(g.block_size for g in groups if g.prefix_cacheable))
    assert (lay.scheduler_block_size, lay.hash_block_size) == ((64, 64) if replay else (64, 32))


# --- num_blocks, the pool block and the tensors -----------------------------------------------------------------

@pytest.mark.parametrize("model", ["deepseek_v4_flash", "deepseek_v4_pro", "deepseek_v41"])
def test_pool_block_is_vllms_block_stride(model):
    from vllm.v1.core.kv_cache_utils import _get_kv_cache_bytes_per_block
    from vllm.v1.kv_cache_interface import KVCacheLayout

    lay = layout(model)
    groups = lay.worker_kv_cache_config.kv_cache_groups
    assert lay.pool_block_bytes == _get_kv_cache_bytes_per_block(groups, KVCacheLayout.BLHNC)
    assert lay.pool_block_bytes == max(g.page_bytes for g in lay.groups())
    assert lay.worker_kv_cache_config.kv_cache_layout == "BLHNC"
    tensors = lay.worker_kv_cache_config.kv_cache_tensors
    assert {t.block_stride for t in tensors} == {lay.pool_block_bytes}
    assert {t.size for t in tensors} == {lay.num_blocks * lay.pool_block_bytes}


@pytest.mark.parametrize("model", ["deepseek_v4_flash", "deepseek_v4_pro", "deepseek_v41"])
@pytest.mark.parametrize("memory", [8 * GiB, 64 * GiB, 64 * GiB + 12_345])
def test_num_blocks_is_the_memory_over_the_pool_block(model, memory):
    lay = layout(model, memory)
    assert lay.num_blocks == memory // lay.pool_block_bytes == lay.vllm_config.cache_config.num_gpu_blocks
    assert lay.worker_kv_cache_config.num_blocks == lay.num_blocks
    assert table(lay) == table(layout(model))  # the groups do not depend on the memory


def test_num_blocks_match_vllms_planner_on_the_same_groups():
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups

    lay = layout("deepseek_v4_flash", 8 * GiB)
    for memory in (8 * GiB, 64 * GiB):
        planned = get_kv_cache_config_from_groups(lay.vllm_config, lay.worker_kv_cache_config.kv_cache_groups,
                                                  memory)
        assert layout("deepseek_v4_flash", memory).num_blocks == planned.num_blocks


# --- errors -----------------------------------------------------------------------------------------------------

def test_unknown_model_is_refused():
    from hkv_vllm.model_layouts import kv_cache_config

    with pytest.raises(ConfigError, match="unknown model 'deepseek_v5'"):
        kv_cache_config("deepseek_v5", memory_bytes=8 * GiB)


@pytest.mark.parametrize("memory", [0, -1, FLASH_POOL_BLOCK - 1])
def test_memory_below_one_block_is_refused(memory):
    from hkv_vllm.model_layouts import kv_cache_config

    with pytest.raises(ConfigError) as info:
        kv_cache_config("deepseek_v4_flash", memory_bytes=memory)
    assert info.value.key == "memory_bytes"


def test_memory_below_one_request_is_refused_as_vllm_refuses_it():
    from hkv_vllm.model_layouts import kv_cache_config

    with pytest.raises(ConfigError, match="max seq len") as info:
        kv_cache_config("deepseek_v4_flash", memory_bytes=4 * FLASH_POOL_BLOCK)
    assert info.value.key == "memory_bytes"


def test_v41_has_no_mtp_drafter_in_vllm():
    from hkv_vllm.model_layouts import kv_cache_config

    with pytest.raises(ConfigError, match="no classic-MTP draft"):
        kv_cache_config("deepseek_v41", memory_bytes=8 * GiB, mtp=True)


def test_v41_on_blackwell_is_not_decided_here():
    from hkv_vllm.model_layouts import BLACKWELL, kv_cache_config

    with pytest.raises(UnsupportedVllmConfig, match="mega attention"):
        kv_cache_config("deepseek_v41", memory_bytes=8 * GiB, device_capability=BLACKWELL)


def test_v4_is_the_same_on_blackwell():
    assert table(layout("deepseek_v4_flash", device_capability=(10, 0))) == FLASH_GROUPS


def test_a_build_leaves_the_platform_and_environment_as_they_were():
    import os

    import torch
    from vllm.platforms import current_platform

    layout("deepseek_v4_pro")  # vLLM's modules imported: what they set in os.environ is theirs to keep
    before = (dict(os.environ), current_platform.get_device_capability(), torch.cuda.Event, torch.cuda.Stream)
    layout("deepseek_v4_pro", 16 * GiB, mtp=True)
    assert (dict(os.environ), current_platform.get_device_capability(), torch.cuda.Event, torch.cuda.Stream) == before
