"""The embedded engine's seeded model, dense, as a Llama folder a Tinker server can load.

SkyRL's JAX backend serves Llama, Qwen3, Qwen3.5 and DeepseekV3 folders, not the engine's
Mixtral. With one expert chosen out of one, the engine's mixture-of-experts block is a plain
SwiGLU MLP (the router's renormalised weight is 1), so that model is a ``LlamaForCausalLM`` with
the same weights: RMSNorm, rotary ``rotate_half`` attention without grouped KV, a separate
``lm_head``. ``rollwire train --trainer tinker`` starts from it on the built-in task, as the TRL
loop starts from the engine's model; only NumPy is needed to write it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rollwire.engine.hf_export import mixtral_config, mixtral_tensors, write_safetensors
from rollwire.engine.model import ModelConfig, TinyModel
from rollwire.engine.tokenizer import tokenizer_files

__all__ = ["DENSE_HIDDEN", "dense_config", "write_dense_model"]

#: the MLP's width: that of the two experts the engine's default model runs per token
DENSE_HIDDEN = 2 * ModelConfig().expert_hidden
#: Mixtral-only keys of the engine's config, absent from a Llama one
_MOE_KEYS = (
    "num_experts_per_tok",
    "num_local_experts",
    "output_router_logits",
    "router_aux_loss_coef",
    "router_jitter_noise",
    "sliding_window",
)
_RENAMES = {
    "block_sparse_moe.experts.0.w1": "mlp.gate_proj",
    "block_sparse_moe.experts.0.w3": "mlp.up_proj",
    "block_sparse_moe.experts.0.w2": "mlp.down_proj",
}


def dense_config(seed: int) -> ModelConfig:
    """The engine model of ``seed`` with one expert (a dense MLP of :data:`DENSE_HIDDEN`)."""
    return ModelConfig(seed=seed, n_experts=1, top_k=1, expert_hidden=DENSE_HIDDEN)


def write_dense_model(folder: str | Path, seed: int) -> Path:
    """Write the dense engine model of ``seed`` as a Llama folder (``config.json``,
    ``model.safetensors``, the engine's tokenizer and chat template); reused when present."""
    out = Path(folder)
    if (out / "model.safetensors").is_file() and (out / "config.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    model = TinyModel(dense_config(seed))
    tensors = {}
    for name, array in mixtral_tensors(model).items():
        if ".block_sparse_moe.gate." in name:
            continue  # the router of a single expert: its weight is always 1
        for old, new in _RENAMES.items():
            name = name.replace(old, new)
        tensors[name] = array
    tok = model.tokenizer
    config = mixtral_config(model.config, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    for key in _MOE_KEYS:
        config.pop(key, None)
    config.update(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        attention_bias=False,
        mlp_bias=False,
        rope_scaling=None,
        pretraining_tp=1,
    )
    for src in tokenizer_files(tok.folder):
        shutil.copyfile(src, out / src.name)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"eos_token_id": [tok.eos_id, tok.pad_id], "pad_token_id": tok.pad_id}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    write_safetensors(out / "model.safetensors", tensors)
    return out
