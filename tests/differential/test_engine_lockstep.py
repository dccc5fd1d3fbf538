"""Serving through the CUDA executor: the model computing where the pools are, tiers included.

- NumPy stand-in and strict stand-in (device arrays that refuse host arrays, as CuPy
  does): served outputs and every pool's bytes equal the reference engine's after
  every request, bit for bit, through evictions to host and disk and a draft step.
- gpu: served == recomputed on the GPU bit for bit; against the NumPy reference
  within float32 tolerance (exp and the reduction kernels differ in the last bits).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from backends import gpu_backend
from lockstep import differing_pools

from hkv_exec_cuda import CudaExecutor, numpy_backend
from hkv_exec_cuda.strict import HostArrayMixed, installed, strict_backend
from hkv_exec_ref import DraftSpec, Engine

TIERS: dict[str, Any] = {"default_pool_pages": 16, "host_bytes": 192 * 1024, "load_policy": "load"}


def workload(seed: int = 0, chats: int = 5, turns: int = 3) -> list[np.ndarray]:
    """Chats sharing a system prompt, interleaved turn by turn (each turn extends the chat's last prompt): the
    16-page device and the small host arena push blocks to host and disk, later turns load them back."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, 64, 19)
    prompts = [np.concatenate([system, rng.integers(0, 64, 9 + chat)]) for chat in range(chats)]
    out = []
    for _ in range(turns):
        out += prompts
        prompts = [np.concatenate([p, rng.integers(0, 64, 13)]) for p in prompts]
    return out


def serve_both(tmp_path: Path, backend: Any) -> list[dict[str, int]]:
    """Serve the workload on a reference engine and one over `backend` (both with host and disk tiers);
    equal outputs and pools after every request; the tokens each took from each tier."""
    ref = Engine.tiny(0, disk_dir=tmp_path / "ref", **TIERS)
    other = Engine.tiny(0, disk_dir=tmp_path / "other", executor=CudaExecutor(backend, staging_bytes=8192), **TIERS)
    cached = []
    for i, prompt in enumerate(workload()):
        draft = DraftSpec(k=3, accept_probability=0.5) if i % 7 == 4 else None
        a, b = ref.generate(prompt, 4, draft=draft), other.generate(prompt, 4, draft=draft)
        assert np.array_equal(a.logits, b.logits) and np.array_equal(a.prompt_logits, b.prompt_logits), i
        # host or disk: the writer thread's timing decides where a record is; the tokens and bytes are the same
        assert a.cached_tokens == b.cached_tokens and a.cached_by_tier["device"] == b.cached_by_tier["device"], i
        assert not differing_pools(ref.executor, other.executor), f"request {i}: pools differ"
        cached.append(b.cached_by_tier)
    ref.close()
    other.close()
    return cached


def test_stand_in_serves_exactly_what_the_reference_serves(tmp_path: Path) -> None:
    cached = serve_both(tmp_path, numpy_backend())
    for tier in ("device", "host", "disk"):
        assert sum(c[tier] for c in cached) > 0, f"the workload never loaded from {tier}"


def test_strict_stand_in_never_mixes_host_arrays_into_device_work(tmp_path: Path) -> None:
    with installed():
        cached = serve_both(tmp_path, strict_backend())
    assert sum(c["disk"] + c["host"] for c in cached) > 0


def test_strict_stand_in_catches_a_host_array_in_device_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """The strict check can fail: the compressor's bias indexed with host positions, as before the fix."""
    from hkv_exec_ref.tiny_v4 import compressor

    def host_index_rows(h: Any, positions: Any, cw: Any) -> Any:
        ratio = cw.bias.shape[0]
        return compressor.proj(h, cw.w_kv), compressor.proj(h, cw.w_gate) + cw.bias[positions % ratio]

    monkeypatch.setattr(compressor, "compressor_rows", host_index_rows)
    with installed(), pytest.raises(HostArrayMixed, match="host array"):
        Engine.tiny(0, executor=CudaExecutor(strict_backend())).generate(workload()[0], 1)


@pytest.mark.gpu
def test_gpu_served_equals_gpu_recomputed_and_the_reference_within_tolerance() -> None:
    backend = gpu_backend()
    gpu = Engine.tiny(0, executor=CudaExecutor(backend))
    ref = Engine.tiny(0)
    for i, prompt in enumerate(workload()):
        served = gpu.generate(prompt, 4)
        assert gpu.matches_recompute(prompt, served), f"request {i}: GPU-served differs from GPU-recomputed"
        expected = ref.generate(prompt, 4)
        assert np.allclose(served.logits, expected.logits, rtol=1e-4, atol=1e-5), i
    assert gpu.stats.requests == len(workload())
