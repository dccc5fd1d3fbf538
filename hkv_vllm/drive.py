"""Drive vLLM's real Scheduler without a model: requests in, faked model outputs back, every step recorded.

As vLLM's own scheduler tests do, the model's outputs are made up (one
sampled token per scheduled request that finished its prompt); what is
compared is the scheduler's decisions.  Used by hkv_vllm's differential tests
(stock vLLM and hkv schedule the same workload alike) and by
benchmarks/bench_vllm_scheduler.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from hkv_vllm.shadow import ShadowWorker

MODEL = "facebook/opt-125m"  # a config the hub cache holds (suite/hub_cache.py); no weights are read


@attrs.frozen(kw_only=True)
class Step:
    """What the scheduler decided in one step."""

    scheduled: tuple[tuple[str, int], ...]     # (request id, tokens scheduled), in id order
    cached: tuple[tuple[str, int], ...]        # new requests and the computed tokens they resumed with
    preempted: tuple[str, ...]
    finished: tuple[str, ...]


def build_scheduler(scheduler_cls: type, *, num_blocks: int, block_size: int = 16, max_num_seqs: int = 16,
                    max_num_batched_tokens: int = 8192, max_model_len: int = 2048,
                    enable_prefix_caching: bool = True, windows: tuple[int, ...] = (0,),
                    block_sizes: tuple[int, ...] | None = None, additional_config: dict[str, Any] | None = None,
                    model_layout: Any = None, policy: str = "fcfs", mamba_groups: int = 0,
                    mamba_checkpoints: int = 0) -> Any:
    """A vLLM scheduler of class `scheduler_cls` over `num_blocks` blocks and one KV cache group per entry of
    `windows`: 0 a full-attention group, else a sliding-window group of that many tokens.  `block_sizes` gives
    each group its own block size (default `block_size` for all); vLLM then schedules in blocks of their LCM
    and hashes in blocks of `block_size`, which must divide them all.  `additional_config` is vLLM's plugin
    configuration (hkv's options under "hkv": `hkv_vllm.scheduler`); `policy` vLLM's scheduling policy ("fcfs"
    or "priority").  `mamba_groups` appends that many Mamba state groups (vLLM's `MambaSpec` in align mode, the
    first group's block size: a linear-attention hybrid such as Qwen3-Next); `mamba_checkpoints` gives every
    Mamba group (also a model layout's) in-kernel prefill checkpoints of that alignment, as vLLM's Mamba2 and
    KDA layers declare them (`num_prefill_checkpoint_blocks=1`).  `model_layout` (an
    `hkv_vllm.model_layouts.ModelLayout`: the KV cache groups vLLM plans for a real model, DeepSeek-V4) replaces
    `windows` and the block sizes: its groups over `num_blocks` blocks, its scheduler and hash block sizes."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
        SlidingWindowSpec,
    )
    from vllm.v1.structured_output import StructuredOutputManager

    model = ModelConfig(model=MODEL, dtype="float16", seed=42, skip_tokenizer_init=True,
                        max_model_len=max_model_len)
    sched = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                            max_model_len=max_model_len, enable_chunked_prefill=True, is_encoder_decoder=False,
                            watermark=0.0, policy=policy)
    cache = CacheConfig(block_size=block_size, gpu_memory_utilization=0.9, cache_dtype="auto",
                        enable_prefix_caching=enable_prefix_caching)
    cache.num_gpu_blocks = num_blocks
    has_mamba = mamba_groups or (model_layout is not None and model_layout.kv_cache_config.has_mamba_layers)
    if has_mamba and enable_prefix_caching:
        cache.mamba_cache_mode = "align"  # as vLLM sets it for a Mamba model with prefix caching
    if has_mamba and model_layout is not None:  # the block the scheduler aligns Mamba chunks to (vLLM's planned)
        cache.block_size = cache.mamba_block_size = model_layout.vllm_config.cache_config.block_size
    config = VllmConfig(scheduler_config=sched, model_config=model, cache_config=cache,
                        additional_config=additional_config or {})
    register_all_kvcache_specs(config)
    if model_layout is not None:
        kv = dataclasses.replace(model_layout.kv_cache_config, num_blocks=num_blocks)
        if mamba_checkpoints:
            kv = dataclasses.replace(kv, kv_cache_groups=[
                dataclasses.replace(g, kv_cache_spec=_checkpointed(g.kv_cache_spec, mamba_checkpoints))
                for g in kv.kv_cache_groups])
        return scheduler_cls(vllm_config=config, kv_cache_config=kv, block_size=model_layout.scheduler_block_size,
                             hash_block_size=model_layout.hash_block_size, log_stats=True,
                             structured_output_manager=StructuredOutputManager(config))
    sizes = block_sizes or (block_size,) * len(windows)
    shape = dict(num_kv_heads=1, head_size=1, dtype=torch.float32)
    specs = [SlidingWindowSpec(**shape, block_size=b, sliding_window=w) if w
             else FullAttentionSpec(**shape, block_size=b) for w, b in zip(windows, sizes, strict=True)]
    specs += [_checkpointed(MambaSpec(block_size=sizes[0], shapes=((1,),), dtypes=(torch.float32,),
                                      mamba_cache_mode=cache.mamba_cache_mode), mamba_checkpoints)
              for _ in range(mamba_groups)]
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec([f"layer{i}"], s) for i, s in enumerate(specs)])
    return scheduler_cls(vllm_config=config, kv_cache_config=kv, block_size=math.lcm(*sizes),
                         hash_block_size=block_size, log_stats=True,
                         structured_output_manager=StructuredOutputManager(config))


def _checkpointed(spec: Any, alignment: int) -> Any:
    """A Mamba group's spec with in-kernel prefill checkpoints of `alignment` tokens (0: the spec as it is)."""
    if not alignment or type(spec).__name__ != "MambaSpec":
        return spec
    return dataclasses.replace(spec, num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=alignment)


def make_request(req_id: str, prompt: list[int], *, max_tokens: int, block_size: int = 16,
                 cache_salt: str | None = None) -> Any:
    """A vLLM Request that decodes exactly `max_tokens` tokens (EOS ignored)."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    params = SamplingParams(ignore_eos=True, max_tokens=max_tokens)
    params.update_from_generation_config({}, 50256)
    return Request(request_id=req_id, prompt_token_ids=list(prompt), sampling_params=params, pooling_params=None,
                   cache_salt=cache_salt, block_hasher=get_request_block_hasher(block_size, sha256))


def step(scheduler: Any, sample: Callable[[str, int], int], shadow: ShadowWorker | None = None) -> Step:
    """One schedule + faked model output + update; `sample(req_id, position)` makes the sampled token.  A
    `shadow` (`hkv_vllm.shadow`) runs the scheduler output as vLLM's worker would before the output is faked,
    checking every KV read of the step."""
    from vllm.v1.outputs import ModelRunnerOutput

    out = scheduler.schedule()
    if shadow is not None:
        shadow.observe(out, lambda req_id: scheduler.requests[req_id].all_token_ids)
    ids = sorted(out.num_scheduled_tokens)
    cached = tuple(sorted((r.req_id, r.num_computed_tokens) for r in out.scheduled_new_reqs))
    sampled = []
    for req_id in ids:
        req = scheduler.requests[req_id]
        done = not req.is_prefill_chunk  # the scheduler's own flag: this step reaches the prompt's end (or decodes)
        sampled.append([sample(req_id, req.num_tokens)] if done else [])
    result = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                               sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={}, pooler_output=[])
    engine_out = scheduler.update_from_output(out, result)
    finished = sorted(r.request_id for o in engine_out.values() for r in o.outputs if r.finish_reason is not None)
    preempted = tuple(sorted(getattr(out, "preempted_req_ids", None) or ()))
    return Step(scheduled=tuple((r, out.num_scheduled_tokens[r]) for r in ids), cached=cached,
                preempted=preempted, finished=tuple(finished))


def run(scheduler: Any, arrivals: dict[int, Iterable[Any]], *, max_steps: int = 10_000,
        sample: Callable[[str, int], int] = lambda req_id, pos: (sum(map(ord, req_id)) * 31 + 7 * pos) % 50000,
        shadow: ShadowWorker | None = None) -> list[Step]:
    """Add each step's arrivals, step until every request finished (or `max_steps`); the steps taken.  A
    `shadow` (`ShadowWorker.for_scheduler(scheduler)`) checks every step's KV reads."""
    steps: list[Step] = []
    last = max(arrivals, default=0)
    for index in range(max_steps):
        for request in arrivals.get(index, ()):
            scheduler.add_request(request)
        if index > last and not scheduler.has_unfinished_requests():
            break
        steps.append(step(scheduler, sample, shadow))
    return steps
