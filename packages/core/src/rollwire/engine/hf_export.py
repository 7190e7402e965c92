"""The engine's model as a Hugging Face ``MixtralForCausalLM`` folder (``save-model --format hf``).

The engine's transformer is Mixtral's architecture at toy size: RMSNorm, rotary attention with
``rotate_half`` pairs and no grouped KV, a softmax-top-k-renormalised router and SwiGLU experts,
separate ``lm_head``. So its weights map one to one onto Mixtral's parameter names and
transformers or vLLM serve the very same model: the same weights, the same logits up to float
rounding, the same expert choices. Tensors are written as safetensors directly (the format is an
8-byte header length, a JSON header and raw little-endian data), so no torch is needed here.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np

from .model import ModelConfig, TinyModel
from .tokenizer import tokenizer_files

__all__ = ["mixtral_config", "mixtral_tensors", "save_hf", "write_safetensors"]

_F32 = np.float32


def mixtral_config(cfg: ModelConfig, *, eos_token_id: int, pad_token_id: int) -> dict[str, Any]:
    """``config.json`` of the Mixtral model equal to an engine model of shape ``cfg``."""
    return {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.expert_hidden,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_model_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "sliding_window": None,
        "attention_dropout": 0.0,
        "num_experts_per_tok": cfg.top_k,
        "num_local_experts": cfg.n_experts,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.0,
        "router_jitter_noise": 0.0,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "torch_dtype": "float32",
    }


def mixtral_tensors(model: TinyModel) -> dict[str, np.ndarray]:
    """The engine's weights under Mixtral's parameter names (``nn.Linear`` stores ``[out, in]``)."""
    cfg, w = model.config, model.w
    d = cfg.d_model
    out: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": w.embed,
        "model.norm.weight": w.final_norm,
        "lm_head.weight": w.lm_head.T,
    }
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        qkv = w.wqkv[i]
        out[p + "input_layernorm.weight"] = w.attn_norm[i]
        out[p + "self_attn.q_proj.weight"] = qkv[:, :d].T
        out[p + "self_attn.k_proj.weight"] = qkv[:, d : 2 * d].T
        out[p + "self_attn.v_proj.weight"] = qkv[:, 2 * d :].T
        out[p + "self_attn.o_proj.weight"] = w.wo[i].T
        out[p + "post_attention_layernorm.weight"] = w.ffn_norm[i]
        out[p + "block_sparse_moe.gate.weight"] = w.router[i].T
        for e in range(cfg.n_experts):
            q = f"{p}block_sparse_moe.experts.{e}."
            out[q + "w1.weight"] = w.w1[i, e].T
            out[q + "w3.weight"] = w.w3[i, e].T
            out[q + "w2.weight"] = w.w2[i, e].T
    return {k: np.ascontiguousarray(v, dtype=_F32) for k, v in out.items()}


def write_safetensors(
    path: str | Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None
) -> Path:
    """Write float32 ``tensors`` as one safetensors file (the layout ``safetensors.numpy`` reads)."""
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    blobs: list[bytes] = []
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        if arr.dtype != _F32:
            raise ValueError(f"tensor {name!r} is {arr.dtype}; only float32 is written")
        data = arr.astype("<f4", copy=False).tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    out = Path(path)
    with out.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for blob in blobs:
            f.write(blob)
    return out


def save_hf(model: TinyModel, folder: str | Path) -> Path:
    """Write ``model`` as a Mixtral folder: ``config.json``, ``generation_config.json``,
    ``model.safetensors`` and the engine's tokenizer files (with ``chat_template.jinja``).

    ``generation_config.json`` lists both ids the engine stops on (``<|im_end|>`` and
    ``<|endoftext|>``), so vLLM stops where the engine does.
    """
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    tok = model.tokenizer
    # The tokenizer's files only: a model loaded from a Mixtral folder has its tokenizer there.
    for src in tokenizer_files(tok.folder):
        if src.resolve() != (out / src.name).resolve():
            shutil.copyfile(src, out / src.name)
    config = mixtral_config(model.config, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"eos_token_id": [tok.eos_id, tok.pad_id], "pad_token_id": tok.pad_id}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    (out / "model.safetensors.index.json").unlink(missing_ok=True)  # this folder has one file
    write_safetensors(out / "model.safetensors", mixtral_tensors(model))
    return out
