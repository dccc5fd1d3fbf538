"""`hkv demo`: a built-in multi-turn and agentic workload (Mooncake trace format) served on
tiny V4 through the cache, every response checked against recomputation."""

from hkv_exec_ref.demo.runner import DemoReport, RequestRow, run_demo
from hkv_exec_ref.demo.workload import TraceRecord, WorkloadConfig, generate_trace, prompt_tokens

__all__ = ["DemoReport", "RequestRow", "TraceRecord", "WorkloadConfig", "generate_trace", "prompt_tokens",
           "run_demo"]
