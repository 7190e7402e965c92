"""The engine's model as a Hugging Face folder (``save-model --format hf``): Mixtral for the
seeded mixture-of-experts model, Llama/Mistral/Qwen2/Qwen3 for a dense one.

The engine's transformer is Mixtral's architecture at toy size: RMSNorm, rotary attention with
``rotate_half`` pairs, a softmax-top-k-renormalised router and SwiGLU experts, separate
``lm_head``. So its weights map one to one onto Mixtral's parameter names and transformers or vLLM
serve the very same model: the same weights, the same logits up to float rounding, the same expert
choices. A dense model (one :mod:`.hf_import` read) maps back onto its own family's names. Tensors
are written as safetensors directly (the format is an 8-byte header length, a JSON header and raw
little-endian data), so no torch is needed here.
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

__all__ = [
    "hf_config",
    "hf_tensors",
    "mixtral_config",
    "mixtral_tensors",
    "save_hf",
    "write_safetensors",
]

_F32 = np.float32
_ARCHITECTURES = {
    "mixtral": "MixtralForCausalLM",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def hf_config(cfg: ModelConfig, *, eos_token_id: int, pad_token_id: int) -> dict[str, Any]:
    """``config.json`` of the Hugging Face model equal to an engine model of shape ``cfg``."""
    if cfg.model_type not in _ARCHITECTURES:
        raise ValueError(
            f"model_type {cfg.model_type!r} has no Hugging Face form; one of {list(_ARCHITECTURES)}"
        )
    if cfg.routed != (cfg.model_type == "mixtral"):
        raise ValueError(
            f"a {'mixture-of-experts' if cfg.routed else 'dense'} model cannot be written as "
            f"{cfg.model_type!r}"
        )
    if cfg.model_type == "qwen2" and (cfg.qkv_bias, cfg.o_bias) != (True, False):
        raise ValueError("a qwen2 model has q/k/v biases and no o_proj bias")
    if cfg.qk_norm != (cfg.model_type == "qwen3"):
        raise ValueError("q/k norm is Qwen3's (model_type 'qwen3') and only Qwen3's")
    if cfg.qkv_bias != cfg.o_bias and cfg.model_type in ("llama", "qwen3"):
        raise ValueError(f"{cfg.model_type}'s attention_bias sets the q/k/v and o biases together")
    if cfg.model_type in ("mistral", "mixtral") and (cfg.qkv_bias or cfg.o_bias):
        raise ValueError(f"{cfg.model_type} has no attention biases")
    rope: dict[str, Any] = {"rope_theta": cfg.rope_theta, "rope_type": "default"}
    rope |= cfg.rope_scaling or {}
    out: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[cfg.model_type]],
        "model_type": cfg.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.expert_hidden,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_model_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": rope,
        "attention_dropout": 0.0,
        "tie_word_embeddings": cfg.tie_embeddings,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "torch_dtype": "float32",
    }
    if cfg.rope_scaling is None:
        del out["rope_parameters"]  # the plain form, as the engine always wrote it
    if cfg.model_type == "mixtral":
        out |= {
            "sliding_window": None,
            "num_experts_per_tok": cfg.top_k,
            "num_local_experts": cfg.n_experts,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.0,
            "router_jitter_noise": 0.0,
        }
    elif cfg.model_type == "mistral":
        out["sliding_window"] = None
    elif cfg.model_type in ("qwen2", "qwen3"):
        out |= {"use_sliding_window": False, "sliding_window": None}
    if cfg.model_type in ("llama", "qwen3"):
        out["attention_bias"] = cfg.qkv_bias
    if cfg.model_type == "llama":
        out["mlp_bias"] = False
    return out


def mixtral_config(cfg: ModelConfig, *, eos_token_id: int, pad_token_id: int) -> dict[str, Any]:
    """``config.json`` of the Mixtral model equal to an engine model of shape ``cfg``."""
    return hf_config(cfg, eos_token_id=eos_token_id, pad_token_id=pad_token_id)


def hf_tensors(model: TinyModel) -> dict[str, np.ndarray]:
    """The engine's weights under its family's parameter names (``nn.Linear`` stores
    ``[out, in]``); the inverse of :func:`.hf_import.weights_from_hf`."""
    cfg, w = model.config, model.w
    q, kv, h = cfg.q_width, cfg.kv_width, cfg.expert_hidden
    out: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": w.embed,
        "model.norm.weight": w.final_norm,
    }
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = w.lm_head.T
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        qkv = w.wqkv[i]
        out[p + "input_layernorm.weight"] = w.attn_norm[i]
        out[p + "self_attn.q_proj.weight"] = qkv[:, :q].T
        out[p + "self_attn.k_proj.weight"] = qkv[:, q : q + kv].T
        out[p + "self_attn.v_proj.weight"] = qkv[:, q + kv :].T
        out[p + "self_attn.o_proj.weight"] = w.wo[i].T
        if w.bqkv is not None:
            out[p + "self_attn.q_proj.bias"] = w.bqkv[i, :q]
            out[p + "self_attn.k_proj.bias"] = w.bqkv[i, q : q + kv]
            out[p + "self_attn.v_proj.bias"] = w.bqkv[i, q + kv :]
        if w.bo is not None:
            out[p + "self_attn.o_proj.bias"] = w.bo[i]
        if w.q_norm is not None and w.k_norm is not None:
            out[p + "self_attn.q_norm.weight"] = w.q_norm[i]
            out[p + "self_attn.k_norm.weight"] = w.k_norm[i]
        out[p + "post_attention_layernorm.weight"] = w.ffn_norm[i]
        if w.router is not None and w.w1 is not None and w.w3 is not None and w.w2 is not None:
            out[p + "block_sparse_moe.gate.weight"] = w.router[i].T
            for e in range(cfg.n_experts):
                x = f"{p}block_sparse_moe.experts.{e}."
                out[x + "w1.weight"] = w.w1[i, e].T
                out[x + "w3.weight"] = w.w3[i, e].T
                out[x + "w2.weight"] = w.w2[i, e].T
        elif w.mlp_in is not None and w.mlp_out is not None:
            out[p + "mlp.gate_proj.weight"] = w.mlp_in[i, :, :h].T
            out[p + "mlp.up_proj.weight"] = w.mlp_in[i, :, h:].T
            out[p + "mlp.down_proj.weight"] = w.mlp_out[i].T
    return {k: np.ascontiguousarray(v, dtype=_F32) for k, v in out.items()}


def mixtral_tensors(model: TinyModel) -> dict[str, np.ndarray]:
    """The engine's weights under Mixtral's parameter names (``nn.Linear`` stores ``[out, in]``)."""
    if not model.config.routed:
        raise ValueError("a dense model has no Mixtral form; use hf_tensors")
    return hf_tensors(model)


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
    """Write ``model`` as a Hugging Face folder of its ``model_type`` (Mixtral for the seeded
    model): ``config.json``, ``generation_config.json``, ``model.safetensors`` and the
    tokenizer's files (with ``chat_template.jinja``).

    ``generation_config.json`` lists every id the engine stops on (for the shipped tokenizer
    ``<|im_end|>`` and ``<|endoftext|>``), so vLLM stops where the engine does.
    """
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    tok = model.tokenizer
    # The tokenizer's files only: a model loaded from a Mixtral folder has its tokenizer there.
    for src in tokenizer_files(tok.folder):
        if src.resolve() != (out / src.name).resolve():
            shutil.copyfile(src, out / src.name)
    config = hf_config(model.config, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    stops = [tok.eos_id, *sorted(tok.stop_ids - {tok.eos_id})]
    generation = {"eos_token_id": stops, "pad_token_id": tok.pad_id}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    (out / "model.safetensors.index.json").unlink(missing_ok=True)  # this folder has one file
    write_safetensors(out / "model.safetensors", hf_tensors(model))
    return out
