"""vLLM's hybrid cache manager with Mamba prefix caching, driven by vLLM's own scheduler, for hkv's replays.

The peer harness (`bench_peers.py`, outside this repository) drives vLLM's
KVCacheManager for full-attention and sliding-window groups only.  This is
the engine it lacks: a linear-attention hybrid (an hkv layout: full-attention
groups beside gated-delta / Mamba groups) as vLLM serves it with prefix
caching on, which needs `mamba_cache_mode="align"`.  In that mode the
scheduler, not the manager, decides where states exist (a prefill chunk ends
on a block boundary, and the state there is kept), so the real `Scheduler`
runs here over the real `KVCacheManager` / `HybridKVCacheCoordinator`, with
made-up model outputs, as vLLM's own scheduler tests do.

Set up as vLLM's engine would for the model (vllm/platforms/interface.py,
`_align_hybrid_block_size`; vllm/v1/core/kv_cache_planning.py): the
attention block grows until one attention page holds a layer's whole state
(kernel blocks of 16 tokens; 544 tokens for Qwen3-Next with its state in
bf16), the state page is padded to it, layers are grouped by vLLM's own
planner, and the budget becomes `num_blocks` through vLLM's
`get_kv_cache_config_from_groups`.  Chunks of `chunk_tokens` (vLLM's 8,192
by default on an H100 / H200 server).

Runs in the peer harness's environment (vLLM 0.33.0 installed without its
dependencies, CPU torch), which the harness's `setup_env.sh` builds.  Three parts
of vLLM that a model-less CPU run cannot import are stood in for, none of
which touches caching: the structured-output manager (no request here asks
for structured output), the model registry's inspection of the model class
(it would import the model's GPU code; what it reports here is the
text-generation decoder it is), and the registry's on-disk cache of that
inspection.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KERNEL_BLOCK_TOKENS = 16  # the attention kernels' block (FlashAttention's multiple of 16)
FLASHINFER_GDN_ALIGNMENT = 64  # FlashInfer's GDN prefill emits states on this grid (vLLM's gdn_attn.py)
CHUNK_TOKENS = 8192  # vLLM's max_num_batched_tokens for an online server on an H100 / H200
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "float8_e4m3fn"}


def _hollow(name: str) -> None:
    """Register package `name` without running its __init__ (its submodules still load from their files)."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, name
    module = types.ModuleType(name)
    module.__path__ = list(spec.submodule_search_locations)
    module.__package__ = name
    sys.modules[name] = module


class _NoStructuredOutput:
    """Stands in for vLLM's StructuredOutputManager: no request of a replay asks for structured output."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def accept_tokens(self, request: Any, tokens: Any) -> bool:
        return True

    def grammar_bitmask(self, *args: Any, **kwargs: Any) -> None:
        return None

    def validate_tokens(self, request: Any, tokens: Any) -> Any:
        return tokens


def load_vllm() -> None:
    """Import vLLM's scheduler on CPU, with the stand-ins above, and a config-only hub cache."""
    if "vllm.v1.core.sched.scheduler" in sys.modules:
        return
    sys.path.insert(0, str(ROOT))
    from hkv_vllm.suite.hub_cache import write_hub_cache

    hub = Path(tempfile.mkdtemp(prefix="hkv-mamba-hub-"))
    write_hub_cache(hub)
    os.environ.update(VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                      HF_HUB_CACHE=str(hub), VLLM_ALLOW_LONG_MAX_MODEL_LEN="1", VLLM_LOGGING_LEVEL="ERROR")
    _hollow("vllm.v1.structured_output")
    sys.modules["vllm.v1.structured_output"].StructuredOutputManager = _NoStructuredOutput  # type: ignore[attr-defined]
    import vllm.model_executor.models.registry as registry

    def decoder_info(load: Any) -> Any:
        fields: dict[str, Any] = {f.name: False for f in dataclasses.fields(registry._ModelInfo)}
        fields.update(architecture="OPTForCausalLM", is_text_generation_model=True, attn_type="decoder",
                      default_seq_pooling_type="LAST", default_tok_pooling_type="ALL", score_type="bi-encoder",
                      supports_pp=True, supports_kv_cache_grouping=True, supported_video_pruning_methods=())
        return registry._ModelInfo(**fields)

    registry._run_in_subprocess = decoder_info
    registry._LazyRegisteredModel._save_modelinfo_to_cache = lambda self, info, digest: None
    import vllm.v1.core.sched.scheduler  # noqa: F401


def _specs(layout: Any, block_tokens: int, torch: Any, checkpoints: bool) -> dict[str, Any]:
    """vLLM's spec of every layer of an hkv hybrid layout (its full-attention and linear groups); `checkpoints`:
    the linear layers export states from inside a prefill (FlashInfer's GDN kernel, as its layer then declares:
    one checkpoint block, on the block grid)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    specs: dict[str, Any] = {}
    for group in layout.groups:
        if group.state is not None:
            state = group.state
            shapes = (tuple(state.conv_shape), tuple(state.ssm_shape))
            dtypes = tuple(getattr(torch, TORCH_DTYPES[d]) for d in (state.conv_dtype, state.ssm_dtype))
            page = block_tokens * _attention_token_bytes(layout, torch)
            for i in group.layer_ids:
                specs[f"layers.{i}.linear_attn"] = MambaSpec(
                    shapes=shapes, dtypes=dtypes, block_size=block_tokens, page_size_padded=page,
                    mamba_cache_mode="align", num_prefill_checkpoint_blocks=int(checkpoints),
                    prefill_checkpoint_alignment=block_tokens if checkpoints else None)
        else:
            dtype, heads, dim = _attention_shape(layout, group.name)
            for i in group.layer_ids:
                specs[f"layers.{i}.self_attn"] = FullAttentionSpec(block_size=block_tokens, num_kv_heads=heads,
                                                                   head_size=dim, dtype=getattr(torch, dtype))
    return dict(sorted(specs.items(), key=lambda item: int(item[0].split(".")[1])))


def _attention_shape(layout: Any, group: str) -> tuple[str, int, int]:
    """(torch dtype name, KV heads, head size) of a full-attention group's pool (entries of [2, heads, dim])."""
    (pool,) = [p for p in layout.pools if p.group_name == group]
    pair, heads, dim = pool.entry_shape
    assert pair == 2, pool  # K and V rows
    return TORCH_DTYPES[pool.dtype], heads, dim


def _attention_token_bytes(layout: Any, torch: Any) -> int:
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    (group,) = [g for g in layout.groups if g.state is None]
    dtype, heads, dim = _attention_shape(layout, group.name)
    spec = FullAttentionSpec(block_size=1, num_kv_heads=heads, head_size=dim, dtype=getattr(torch, dtype))
    return int(spec.page_size_bytes)


def vllm_block_tokens(layout: Any, checkpoints: bool = False) -> int:
    """The attention block vLLM picks so one attention page holds one layer's state (its own rule), on the
    kernel block's grid, and with FlashInfer's GDN checkpoints on theirs too."""
    import torch
    from vllm.v1.kv_cache_interface import MambaSpec

    (state,) = [g.state for g in layout.groups if g.state is not None]
    dtypes = tuple(getattr(torch, TORCH_DTYPES[d]) for d in (state.conv_dtype, state.ssm_dtype))
    mamba_page = MambaSpec(shapes=(tuple(state.conv_shape), tuple(state.ssm_shape)), dtypes=dtypes,
                           block_size=-1).page_size_bytes
    align = math.lcm(KERNEL_BLOCK_TOKENS, FLASHINFER_GDN_ALIGNMENT) if checkpoints else KERNEL_BLOCK_TOKENS
    return align * math.ceil(mamba_page / (align * _attention_token_bytes(layout, torch)))


class VllmMambaEngine:
    """vLLM 0.33's Scheduler + KVCacheManager over an hkv hybrid layout in `memory_bytes` of KV cache memory;
    requests are served one at a time, whole, one output token each (as hkv's replay serves them)."""

    name = "vllm-mamba-align"

    def __init__(self, layout: Any, memory_bytes: int, max_model_len: int, chunk_tokens: int = CHUNK_TOKENS,
                 prefix_match_tokens: int | None = None, checkpoints: bool = False) -> None:
        load_vllm()
        import torch
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups, get_kv_cache_groups
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs

        self.block_tokens = bt = vllm_block_tokens(layout, checkpoints)
        self.checkpoints = checkpoints
        model = ModelConfig(model="facebook/opt-125m", dtype="bfloat16", seed=0, skip_tokenizer_init=True,
                            max_model_len=max_model_len)
        sched = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=chunk_tokens, max_model_len=max_model_len,
                                enable_chunked_prefill=True, is_encoder_decoder=False, watermark=0.0)
        cache = CacheConfig(block_size=bt, cache_dtype="auto", enable_prefix_caching=True, mamba_cache_mode="align")
        cache.mamba_block_size = bt
        cache.mamba_page_size_padded = bt * _attention_token_bytes(layout, torch)
        cache.kv_cache_layout = "NHD"  # FlashAttention's: layers outermost
        cache.prefix_match_unit = prefix_match_tokens  # finer hits than a block (vLLM's option; None: blocks)
        hash_tokens = prefix_match_tokens or bt
        config = VllmConfig(scheduler_config=sched, model_config=model, cache_config=cache)
        groups = get_kv_cache_groups(config, _specs(layout, bt, torch, checkpoints))
        self.kv_config = get_kv_cache_config_from_groups(config, groups, memory_bytes)
        self.groups = [(type(g.kv_cache_spec).__name__, len(g.layer_names)) for g in groups]
        cache.num_gpu_blocks = self.kv_config.num_blocks
        register_all_kvcache_specs(config)
        self.scheduler = Scheduler(vllm_config=config, kv_cache_config=self.kv_config, block_size=bt,
                                   hash_block_size=hash_tokens, log_stats=False,
                                   structured_output_manager=_NoStructuredOutput())
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(hash_tokens, sha256)
        self.served = 0

    @property
    def device_bytes(self) -> int:
        """The bytes of the KV cache tensors vLLM would allocate (groups alias one allocation)."""
        return max(t.offset + t.size for t in self.kv_config.kv_cache_tensors)

    def serve(self, tokens: list[int]) -> int | None:
        """One request start to end: the tokens its prefill resumed from (None: never scheduled, no room)."""
        from vllm.sampling_params import SamplingParams
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request, RequestStatus

        self.served += 1
        params = SamplingParams(ignore_eos=True, max_tokens=1)
        request = Request(request_id=str(self.served), prompt_token_ids=tokens, sampling_params=params,
                          pooling_params=None, block_hasher=self.hasher)
        s, hit = self.scheduler, None
        s.add_request(request)
        while s.has_unfinished_requests():
            out = s.schedule()
            if not out.num_scheduled_tokens:  # nothing fits, even with the cache emptied
                s.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)
                return None
            for new in out.scheduled_new_reqs:  # its first scheduling: what the prefill resumed from
                if hit is None:
                    hit = new.num_computed_tokens
            ids = sorted(out.num_scheduled_tokens)
            sampled = [[] if s.requests[i].is_prefill_chunk else [1] for i in ids]
            s.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                        sampled_token_ids=sampled, logprobs=None,
                                                        prompt_logprobs_dict={}, pooler_output=[]))
        assert hit is not None
        return hit
