"""A tiny random Llama that vLLM loads offline: config.json, model.safetensors, tokenizer.json.

`write_tiny_llama(folder, seed)` writes it; everything is a function of the seed.  Two layers,
hidden 256, head_dim 64 (vLLM's CPU attention refuses 16), vocab 512, a word-level tokenizer
("t0" .. "t507" and four special tokens).  Weights are scaled so that greedy decoding has clear
margins between the best and second-best token (a random model initialised at std 0.02 has
nearly flat logits, where any rounding difference would flip an argmax).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB = 512
HIDDEN = 256
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 512
MAX_POSITIONS = 4096
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
WORDS = VOCAB - len(SPECIALS)  # token ids 4 .. 511 are the words "t0" .. "t507"


def config(sliding_window: int = 0) -> dict[str, object]:
    """The model's config.json; with `sliding_window`, layer 0 attends to a window of that many tokens and
    layer 1 to everything (vLLM lays the cache out as a sliding-window group and a full-attention group)."""
    hybrid = {"layer_types": ["sliding_attention"] + ["full_attention"] * (LAYERS - 1),
              "sliding_window": sliding_window} if sliding_window else {}
    return hybrid | {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
        "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "max_position_embeddings": MAX_POSITIONS, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32",
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
    }


def weights(seed: int) -> dict[str, torch.Tensor]:
    """Seeded random weights under the names vLLM's LlamaForCausalLM loads."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    scale = HIDDEN ** -0.5
    out = {"model.embed_tokens.weight": rand(VOCAB, HIDDEN, std=1.0),
           "model.norm.weight": torch.ones(HIDDEN),
           "lm_head.weight": rand(VOCAB, HIDDEN, std=4.0 * scale)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out |= {p + "input_layernorm.weight": torch.ones(HIDDEN),
                p + "post_attention_layernorm.weight": torch.ones(HIDDEN),
                p + "self_attn.q_proj.weight": rand(HEADS * HEAD_DIM, HIDDEN, std=2.0 * scale),
                p + "self_attn.k_proj.weight": rand(KV_HEADS * HEAD_DIM, HIDDEN, std=2.0 * scale),
                p + "self_attn.v_proj.weight": rand(KV_HEADS * HEAD_DIM, HIDDEN, std=scale),
                p + "self_attn.o_proj.weight": rand(HIDDEN, HEADS * HEAD_DIM, std=scale),
                p + "mlp.gate_proj.weight": rand(INTERMEDIATE, HIDDEN, std=scale),
                p + "mlp.up_proj.weight": rand(INTERMEDIATE, HIDDEN, std=scale),
                p + "mlp.down_proj.weight": rand(HIDDEN, INTERMEDIATE, std=INTERMEDIATE ** -0.5)}
    return out


def tokenizer_json() -> dict[str, object]:
    """A `tokenizers` WordLevel tokenizer over whitespace-separated words, as tokenizer.json."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS)} | {f"t{i}": len(SPECIALS) + i for i in range(WORDS)}
    added = [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, tok in enumerate(SPECIALS)]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
            "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}


def tokenizer_config() -> dict[str, object]:
    return {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
            "eos_token": "</s>", "pad_token": "<pad>", "model_max_length": MAX_POSITIONS,
            "add_bos_token": False, "add_eos_token": False}


def write_tiny_llama(folder: Path, seed: int = 0, sliding_window: int = 0) -> Path:
    """Write the model directory into `folder` (created if missing) and return it (`config` for the window)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config(sliding_window), indent=1))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    save_file(weights(seed), str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=1))
    return folder
