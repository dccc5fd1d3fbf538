"""The demo: serve the built-in workload on tiny V4 through the cache, check every response
against recomputation, and gather the figures `hkv demo` prints."""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from hkv_core.executor import Executor
from hkv_core.executor_tally import Tally
from hkv_exec_ref.demo.workload import TraceRecord, WorkloadConfig, generate_trace, prompt_tokens
from hkv_exec_ref.engine import DraftSpec, Engine
from hkv_exec_ref.tiny_v4 import Fault

# Device pools small enough that the workload's later sessions evict earlier ones.
HF_MODEL = "hf-deepseek-v4"  # --model: transformers' DeepSeek-V4 served through HfEngine
HYBRID_MODEL = "tiny-linear"  # --model: the tiny linear-attention hybrid (hkv_exec_ref.tiny_linear)
MODELS = ("tiny-v4", HF_MODEL, HYBRID_MODEL)
DEMO_LIMITS: dict[str, Any] = {"default_pool_pages": 160, "retain_every_blocks": 2}
# With --tiers: a device and a host tier smaller still, so blocks keep moving device -> host -> disk and back.
TIER_LIMITS: dict[str, Any] = {"default_pool_pages": 96, "retain_every_blocks": 2}
TIER_HOST_BYTES = 1 << 20  # 128 records of tiny V4 (each takes 8 KiB: the 4 KiB header, the payload padded)


@attrs.frozen(kw_only=True)
class TierReport:
    """What the tiers did: tokens served per tier, decisions, the cache's counters, restarts."""

    cached_by_tier: dict[str, int]
    decisions: dict[str, int]
    counts: dict[str, int]
    directory: str
    restarts: int
    direct_io: bool
    direct_io_fallback: str


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
    tiers: TierReport | None = None  # with --tiers
    executor: str = "ref"  # what held the pools: ref (RefExecutor), or hkv_exec_cuda's backend name (--executor)
    model: str = "tiny-v4"  # what served: hkv's TinyV4, or hf-deepseek-v4 (HF transformers' model, --model)

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
        out["tiers"] = attrs.asdict(self.tiers) if self.tiers else None
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
             progress: Callable[[int], None] | None = None, draft: DraftSpec | None = None,
             tier_dir: Path | None = None, executor: Callable[[], Executor] | None = None,
             executor_name: str = "ref", model: str = "tiny-v4") -> DemoReport:
    """Serve the workload (speculatively with `draft`); `progress(i)` after each request.  With `tier_dir`
    (emptied first), host and disk tiers back a smaller device, and the engine is closed and reopened on the
    directory halfway through: the second half starts from what the disk kept.  `executor` makes each
    engine's executor (None: a RefExecutor), `executor_name` says which in the report.  `model`: "tiny-v4"
    (hkv's exact TinyV4), "hf-deepseek-v4" (transformers' DeepSeek-V4 through HfEngine, checked against HF
    over the same calls) or "tiny-linear" (the tiny linear hybrid through HybridServer); the last two run
    without tiers, drafts, faults or another executor."""
    trace = generate_trace(cfg)
    tiers: dict[str, Any] = {}
    if tier_dir is not None:
        shutil.rmtree(tier_dir, ignore_errors=True)
        tiers = {**TIER_LIMITS, "disk_dir": tier_dir, "host_bytes": TIER_HOST_BYTES}
    options = {**DEMO_LIMITS, **tiers, **(limits or {})}
    if model == HYBRID_MODEL:
        from hkv_exec_ref.demo.hybrid import run_hybrid_demo

        assert not tiers and draft is None and executor is None and not fault, "the hybrid demo runs without them"
        return run_hybrid_demo(cfg, trace, options, progress)

    def open_engine() -> Engine:
        if model == HF_MODEL:
            from hkv_exec_ref.hf import HfEngine

            assert not tiers and draft is None and executor is None, "the HF demo runs without them"
            return HfEngine.tiny("deepseek_v4", cfg.seed, **{**options, "retain_every_blocks": 1})
        return Engine.tiny(seed=cfg.seed, faults=fault, executor=executor() if executor else None, **options)

    engine = open_engine()
    totals = TierTotals()
    began = time.perf_counter()
    rows = []
    for i, record in enumerate(trace):
        if tier_dir is not None and i == len(trace) // 2:  # a restart: device and host start empty
            engine = totals.restart(engine, open_engine)
        rows.append(serve_one(engine, i, record, cfg, draft))
        if progress is not None:
            progress(i + 1)
    report = _report(engine, rows, time.perf_counter() - began, fault, draft, totals.carried)
    if tier_dir is not None:
        report = attrs.evolve(report, tiers=totals.finish(engine, str(tier_dir)))
    return attrs.evolve(report, executor=executor_name, model=model)


@attrs.define
class TierTotals:
    """Tier figures summed over the engines a demo ran (one per restart)."""

    counts: Counter[str] = attrs.field(factory=Counter)
    carried: Counter[str] = attrs.field(factory=Counter)  # executor and manager counters of closed engines
    restarts: int = 0

    def restart(self, engine: Engine, reopen: Callable[[], Engine]) -> Engine:
        """Close `engine` and open another on its directory; the request statistics carry over."""
        self._add(engine)
        tally, stats = _tally(engine), engine.manager.stats
        self.carried.update(pages_moved=tally.pages_moved, entries_copied=tally.entries_copied,
                            entries_written=tally.entries_written, evicted_blocks=stats["evicted_blocks"],
                            evicted_points=stats["evicted_points"])
        engine.close()
        self.restarts += 1
        reopened = reopen()
        reopened.stats = engine.stats
        return reopened

    def _add(self, engine: Engine) -> None:
        assert engine.tiers is not None
        report = engine.tiers.cache.report()
        self.counts.update({k: v for k, v in report["counts"].items() if k != "store_us"})

    def finish(self, engine: Engine, directory: str) -> TierReport:
        assert engine.tiers is not None
        self._add(engine)
        report = engine.tiers.cache.report()
        engine.close()
        return TierReport(cached_by_tier=dict(engine.stats.cached_by_tier), decisions=dict(engine.stats.decisions),
                          counts=dict(self.counts),
                          directory=directory, restarts=self.restarts, direct_io=bool(report.get("direct_io")),
                          direct_io_fallback=str(report.get("direct_io_fallback", "")))


def _tally(engine: Engine) -> Tally:
    """The engine's executor's copy tally (the reference and the CUDA executor both keep one)."""
    tally = getattr(engine.executor, "tally", None)
    assert isinstance(tally, Tally), type(engine.executor)
    return tally


def _report(engine: Engine, rows: list[RequestRow], seconds: float, fault: Fault, draft: DraftSpec | None,
            carried: Counter[str]) -> DemoReport:
    s, tally, core_stats = engine.stats, _tally(engine), Counter(engine.manager.stats)
    tally = attrs.evolve(tally, **{k: getattr(tally, k) + carried[k]
                                   for k in ("pages_moved", "entries_copied", "entries_written")})
    core_stats.update({k: carried[k] for k in ("evicted_blocks", "evicted_points")})
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
