"""`hkv demo --model tiny-linear`: the demo workload served on the tiny linear hybrid (hkv_exec_ref.tiny_linear).

Every request of the trace is served through hkv (`HybridServer.generate`: the prompt past its hit, then
greedy decoding) and checked against a full recomputation: every logit of every position it computed, and
every generated token the greedy choice.  The report has the tiny V4 demo's fields.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hkv_core.layout import Layout, load_preset_config
from hkv_core.manager import CacheManager, ManagerConfig
from hkv_exec_ref.demo.runner import DemoReport, RequestRow
from hkv_exec_ref.demo.workload import TraceRecord, WorkloadConfig, prompt_tokens
from hkv_exec_ref.engine.results import cached_by_kind
from hkv_exec_ref.executor import RefExecutor
from hkv_exec_ref.tiny_linear import Generated, HybridConfig, HybridServer, TinyHybrid

HYBRID_MODEL = "tiny-linear"
HYBRID_PRESET = "tiny_linear"


def exact(model: TinyHybrid, prompt: np.ndarray, served: Generated) -> bool:
    """Every served logit equals recomputation, and every generated token is the greedy choice."""
    n = len(served.tokens)
    full = model.recompute(np.concatenate([prompt, served.tokens[:-1]]))
    decode = full[len(prompt) - 1:][:n]
    return bool(np.array_equal(full[served.cached_tokens:], served.logits)
                and np.array_equal(np.argmax(decode, axis=1), served.tokens))


def run_hybrid_demo(cfg: WorkloadConfig, trace: Sequence[TraceRecord], options: dict[str, Any],
                    progress: Callable[[int], None] | None = None) -> DemoReport:
    """Serve `trace` on the tiny hybrid with pools of `options` (ManagerConfig fields) and check each response."""
    layout = Layout.from_preset(HYBRID_PRESET)
    model = TinyHybrid(HybridConfig.from_hf_config(load_preset_config(HYBRID_PRESET), seed=cfg.seed))
    manager = CacheManager(layout, ManagerConfig(**options, key_seed=cfg.seed))
    executor = RefExecutor()
    server = HybridServer(model, manager, executor)
    began, rows = time.perf_counter(), []
    by_kind, reasons = Counter[str](), Counter[tuple[str, str]]()
    prompt_total = generated = cached = 0
    for i, record in enumerate(trace):
        prompt = prompt_tokens(record, cfg)
        served = server.generate(prompt, record.output_length)
        rows.append(RequestRow(index=i, session=record.session, kind=record.kind, input_length=record.input_length,
                               output_length=record.output_length, cached_tokens=served.cached_tokens,
                               exact=exact(model, prompt, served)))
        by_kind.update(cached_by_kind(layout, served.cached_tokens))
        reasons.update(set(served.reasons))
        prompt_total, generated, cached = (prompt_total + len(prompt), generated + len(served.tokens),
                                           cached + served.cached_tokens)
        if progress is not None:
            progress(i + 1)
    validation: dict[str, dict[str, int]] = {}
    for (layer, code), n in sorted(reasons.items()):
        validation.setdefault(layer, {})[code] = n
    stats, tally = manager.stats, executor.tally
    return DemoReport(
        requests=len(rows), prompt_tokens=prompt_total, generated_tokens=generated, cached_tokens=cached,
        cached_by_kind=dict(by_kind), computed_tokens=prompt_total - cached + generated - len(rows),
        validation=validation, pages_moved=tally.pages_moved, entries_copied=tally.entries_copied,
        entries_written=tally.entries_written, evicted_blocks=stats["evicted_blocks"],
        evicted_points=stats["evicted_points"], exact_matches=sum(r.exact for r in rows),
        mismatches=tuple(r.index for r in rows if not r.exact), seconds=round(time.perf_counter() - began, 3),
        fault="NONE", rows=tuple(rows), model=HYBRID_MODEL)
