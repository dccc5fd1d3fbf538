"""A Hugging Face hub cache holding only the config files vLLM's scheduler tests name.

vLLM's tests build a `ModelConfig` for a model id (facebook/opt-125m,
llava-hf/llava-1.5-7b-hf, Qwen/Qwen1.5-7B, and Qwen/Qwen3-0.6B: the model a
bare `ModelConfig()` names, as the KV cache planning tests build it); with
`HF_HUB_OFFLINE=1` and this cache that reads the config from disk.  No
weights, no tokenizer, nothing downloaded: the scheduler tests never run a
model.  The configs are the public ones' shape
(architecture, sizes, vocabulary), which is all a scheduler reads.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REVISION = "0" * 40  # a snapshot name; the refs/main file points at it

CONFIGS: dict[str, dict[str, object]] = {
    "facebook/opt-125m": {
        "architectures": ["OPTForCausalLM"], "model_type": "opt", "activation_function": "relu",
        "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1, "do_layer_norm_before": True,
        "ffn_dim": 3072, "hidden_size": 768, "word_embed_proj_dim": 768, "max_position_embeddings": 2048,
        "num_attention_heads": 12, "num_hidden_layers": 12, "vocab_size": 50272, "torch_dtype": "float16",
        "dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0, "init_std": 0.02,
        "layerdrop": 0.0, "use_cache": True, "prefix": "</s>",
    },
    "llava-hf/llava-1.5-7b-hf": {
        "architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "ignore_index": -100,
        "image_token_index": 32000, "pad_token_id": 32001, "projector_hidden_act": "gelu",
        "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": 32064,
        "vision_feature_layer": -2, "vision_feature_select_strategy": "default",
        "text_config": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                        "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32,
                        "num_key_value_heads": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-05,
                        "torch_dtype": "float16", "vocab_size": 32064},
        "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "image_size": 336,
                          "intermediate_size": 4096, "num_attention_heads": 16, "num_hidden_layers": 24,
                          "patch_size": 14, "projection_dim": 768, "vocab_size": 32000},
    },
    "Qwen/Qwen3-0.6B": {  # ModelConfig's default model
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
        "max_position_embeddings": 40960, "max_window_layers": 28, "num_attention_heads": 16,
        "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
    },
    "Qwen/Qwen1.5-7B": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 32768,
        "max_window_layers": 28, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
    },
}


def write_hub_cache(hub_dir: Path) -> list[Path]:
    """Write one snapshot with config.json per model id under `hub_dir` (HF_HUB_CACHE); the paths written."""
    written = []
    for model_id, config in CONFIGS.items():
        repo = hub_dir / ("models--" + model_id.replace("/", "--"))
        snapshot = repo / "snapshots" / REVISION
        snapshot.mkdir(parents=True, exist_ok=True)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(REVISION)
        path = snapshot / "config.json"
        path.write_text(json.dumps(config, indent=1) + "\n")
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write_hub_cache(Path(sys.argv[1])):
        print(path)
