"""The end-to-end check's verdict: hkv's run against stock vLLM with prefix caching off, request by request, and
its cached tokens against stock vLLM's own prefix caching."""

from __future__ import annotations

from typing import Any


def _row_diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    same_prompt, same_tokens = a["prompt"] == b["prompt"], a["tokens"] == b["tokens"]
    n = min(len(a["logprobs"]), len(b["logprobs"]))
    diffs = [abs(x - y) for x, y in zip(a["logprobs"][:n], b["logprobs"][:n], strict=True)]
    return {"user": a["user"], "turn": a["turn"], "prompt_tokens": len(a["prompt"]), "cached": a["cached"],
            "same_prompt": same_prompt, "same_tokens": same_tokens, "max_logprob_diff": max(diffs, default=0.0),
            "bit_equal": same_tokens and a["logprobs"] == b["logprobs"]}


def _largest(rows: list[dict[str, Any]]) -> float:
    return max((r["max_logprob_diff"] for r in rows), default=0.0)


def compare(hkv: dict[str, Any], stock: dict[str, Any], cached: dict[str, Any]) -> dict[str, Any]:
    """Per request: tokens equal, largest logprob difference, bit-equal; and the runs' counters (`cached`: stock
    vLLM with its own prefix caching)."""
    key = {(r["user"], r["turn"]): r for r in stock["rows"]}
    rows = [_row_diff(r, key[(r["user"], r["turn"])]) for r in hkv["rows"]]
    hit, cold = [r for r in rows if r["cached"]], [r for r in rows if not r["cached"]]
    stats = hkv["hkv_stats"]
    report = {
        "requests": len(rows), "token_equal": sum(r["same_tokens"] for r in rows),
        "mismatches": [(r["user"], r["turn"]) for r in rows if not r["same_tokens"]],
        "bit_equal_logprobs": sum(r["bit_equal"] for r in rows),
        "max_logprob_diff": _largest(rows), "max_logprob_diff_with_hit": _largest(hit),
        "max_logprob_diff_without_hit": _largest(cold),
        "hit_tokens": sum(r["cached"] for r in rows), "requests_with_hit": len(hit),
        "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
        "stock_hit_tokens": sum(r["cached"] for r in stock["rows"]),
        "vllm_cached_hit_tokens": sum(r["cached"] for r in cached["rows"]),
        "vllm_cached_preemptions": cached["preemptions"],
        "vllm_cached_token_equal": sum(a["tokens"] == b["tokens"] for a, b in zip(
            sorted(cached["rows"], key=lambda r: (r["user"], r["turn"])),
            sorted(stock["rows"], key=lambda r: (r["user"], r["turn"])), strict=True)),
        "evictions": stats.get("evictions", 0), "evicted_blocks": stats.get("evicted_blocks", 0),
        "block_copies": stats.get("copies", 0),
        "preemptions": hkv["preemptions"], "stock_preemptions": stock["preemptions"],
        "engine": hkv["engine"], "scheduler": hkv["scheduler"], "manager": hkv["manager"],
        "engine_start_s": {"hkv": hkv["engine_start_s"], "stock": stock["engine_start_s"]},
        "serve_s": {"hkv": hkv["serve_s"], "stock": stock["serve_s"]}, "workload": hkv["workload"],
        "rows": rows,
    }
    report["exercised"] = {"hits": report["hit_tokens"] > 0, "evictions": report["evictions"] > 0,
                           "preemptions": report["preemptions"] > 0}
    if hkv["workload"].get("fine_hits"):
        report["exercised"]["partial-block copies"] = report["block_copies"] > 0
    report["hits_at_least_vllms"] = report["hit_tokens"] >= report["vllm_cached_hit_tokens"]
    report["ok"] = not report["mismatches"]
    return report
