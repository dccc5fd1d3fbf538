"""The demo: serve the built-in workload on tiny V4 through the cache, check every response
against recomputation, and gather the figures `hkv demo` prints."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs

from hkv_exec_ref.demo.workload import TraceRecord, WorkloadConfig, generate_trace, prompt_tokens
from hkv_exec_ref.engine import DraftSpec, Engine
from hkv_exec_ref.tiny_v4 import Fault

# Device pools small enough that the workload's later sessions evict earlier ones.
DEMO_LIMITS: dict[str, Any] = {"default_pool_pages": 160, "retain_every_blocks": 2}


@attrs.frozen(kw_only=True)
class RequestRow:
    """One served request, for the chart and --json."""

    index: int
    session: int
    kind: str
    input_length: int
    output_length: int
    cached_tokens: int
    exact: bool


@attrs.frozen(kw_only=True)
class DemoReport:
    """Every figure of the demo table."""

    requests: int
    prompt_tokens: int
    generated_tokens: int
    cached_tokens: int
    cached_by_kind: dict[str, int]
    computed_tokens: int
    validation: dict[str, dict[str, int]]  # layer -> reason code -> requests
    pages_moved: int
    entries_copied: int
    entries_written: int
    evicted_blocks: int
    evicted_points: int
    exact_matches: int
    mismatches: tuple[int, ...]
    seconds: float
    fault: str
    rows: tuple[RequestRow, ...]
    draft_k: int = 0  # draft tokens per speculative step (0: no speculation)
    proposed_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def tokens_served(self) -> int:
        return self.prompt_tokens + self.generated_tokens

    @property
    def ok(self) -> bool:
        return not self.mismatches and self.exact_matches == self.requests

    def to_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self, recurse=True)
        out["tokens_served"], out["ok"] = self.tokens_served, self.ok
        out["mismatches"] = list(self.mismatches)
        out["rows"] = [attrs.asdict(r) for r in self.rows]
        return out


def serve_one(engine: Engine, index: int, record: TraceRecord, cfg: WorkloadConfig,
              draft: DraftSpec | None = None) -> RequestRow:
    """Serve a trace record through the cache and check it against a full recomputation."""
    prompt = prompt_tokens(record, cfg)
    served = engine.generate(prompt, record.output_length, cache_salt=None, draft=draft)
    return RequestRow(index=index, session=record.session, kind=record.kind, input_length=record.input_length,
                      output_length=record.output_length, cached_tokens=served.cached_tokens,
                      exact=engine.matches_recompute(prompt, served))


def run_demo(cfg: WorkloadConfig, *, fault: Fault = Fault.NONE, limits: dict[str, Any] | None = None,
             progress: Callable[[int], None] | None = None, draft: DraftSpec | None = None) -> DemoReport:
    """Serve the workload (speculatively with `draft`); `progress(i)` after each request."""
    trace = generate_trace(cfg)
    engine = Engine.tiny(seed=cfg.seed, faults=fault, **{**DEMO_LIMITS, **(limits or {})})
    began = time.perf_counter()
    rows = []
    for i, record in enumerate(trace):
        rows.append(serve_one(engine, i, record, cfg, draft))
        if progress is not None:
            progress(i + 1)
    return _report(engine, rows, time.perf_counter() - began, fault, draft)


def _report(engine: Engine, rows: list[RequestRow], seconds: float, fault: Fault,
            draft: DraftSpec | None) -> DemoReport:
    s, tally, core_stats = engine.stats, engine.executor.tally, engine.manager.stats
    validation: dict[str, dict[str, int]] = {}
    for (layer, code), n in sorted(s.reasons.items()):
        validation.setdefault(layer, {})[code] = n
    return DemoReport(
        requests=len(rows), prompt_tokens=s.prompt_tokens, generated_tokens=s.generated_tokens,
        cached_tokens=s.cached_tokens, cached_by_kind=dict(s.cached_by_kind), computed_tokens=s.computed_tokens,
        validation=validation, pages_moved=tally.pages_moved, entries_copied=tally.entries_copied,
        entries_written=tally.entries_written, evicted_blocks=core_stats["evicted_blocks"],
        evicted_points=core_stats["evicted_points"], exact_matches=sum(r.exact for r in rows),
        mismatches=tuple(r.index for r in rows if not r.exact), seconds=round(seconds, 3),
        fault=fault.name or "NONE", rows=tuple(rows), draft_k=draft.k if draft else 0,
        proposed_tokens=s.proposed_tokens, accepted_tokens=s.accepted_tokens)
