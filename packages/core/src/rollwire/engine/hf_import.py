"""A Hugging Face ``MixtralForCausalLM`` folder read back into the engine's model: the inverse of
:mod:`.hf_export`, without torch.

safetensors is parsed by hand, as :func:`.hf_export.write_safetensors` writes it: an 8-byte
little-endian header length, a JSON header naming each tensor's dtype, shape and byte range, then
raw little-endian data. F32 is read as is; F16 and BF16 are widened to float32 (exactly). Every
problem is a :class:`~.model.WeightsError` naming the file, tensor or config key.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from .model import ModelConfig, TinyModel, WeightsError, _Weights
from .tokenizer import EngineTokenizer

__all__ = ["hf_model_config", "load_hf", "read_safetensors", "read_tensors", "weights_from_mixtral"]

_F32 = np.float32
#: safetensors dtype -> (little-endian NumPy dtype it is stored as, bytes per element).
_DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2)}
#: Buffers some checkpoints carry that the model recomputes; skipped, never an error.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of one ``.safetensors`` file as float32 arrays (F32, F16 or BF16 on disk)."""
    src = Path(path)
    raw = src.read_bytes()
    if len(raw) < 8:
        raise WeightsError(f"{src} is not a safetensors file: {len(raw)} bytes, no header")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise WeightsError(f"{src} is truncated: its header says {n} bytes, the file has less")
    try:
        header = json.loads(raw[8 : 8 + n])
    except ValueError as exc:
        raise WeightsError(f"{src} has an unreadable safetensors header: {exc}") from exc
    if not isinstance(header, dict):
        raise WeightsError(f"{src}: the safetensors header is not a JSON object")
    data = memoryview(raw)[8 + n :]
    return {
        name: _tensor(src, name, spec, data)
        for name, spec in header.items()
        if name != "__metadata__"
    }


def _tensor(src: Path, name: str, spec: Any, data: memoryview) -> np.ndarray:
    if not isinstance(spec, dict) or not {"dtype", "shape", "data_offsets"} <= spec.keys():
        raise WeightsError(f"tensor {name!r} in {src} has no dtype/shape/data_offsets: {spec!r}")
    dtype, shape, (a, b) = spec["dtype"], [int(x) for x in spec["shape"]], spec["data_offsets"]
    if dtype not in _DTYPES:
        raise WeightsError(
            f"tensor {name!r} in {src} is {dtype}; the engine reads F32, F16 and BF16 "
            "(save the checkpoint in one of those)"
        )
    np_dtype, size = _DTYPES[dtype]
    count = int(np.prod(shape, dtype=np.int64))
    if not 0 <= a <= b <= len(data) or b - a != count * size:
        raise WeightsError(
            f"tensor {name!r} in {src}: bytes [{a}, {b}) do not hold {dtype} {shape} "
            f"({count * size} bytes) inside the {len(data)}-byte data section"
        )
    flat = np.frombuffer(data[a:b], dtype=np_dtype)
    if dtype == "BF16":  # bfloat16 is the top half of a float32: widening is exact
        return (flat.astype(np.uint32) << 16).view(_F32).reshape(shape)
    return flat.astype(_F32).reshape(shape)  # a native-order copy, detached from the file


def read_tensors(folder: str | Path) -> dict[str, np.ndarray]:
    """All tensors of a folder: the files ``model.safetensors.index.json`` names, else every
    ``*.safetensors`` in it."""
    src = Path(folder)
    index = src / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted({src / str(f) for f in weight_map.values()})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise WeightsError(f"{index} has no usable weight_map: {exc}") from exc
    else:
        files = sorted(src.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"{src} has no *.safetensors file")
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        if not f.exists():
            raise WeightsError(f"{index} names {f.name}, which is not in {src}")
        for name, arr in read_safetensors(f).items():
            if name in tensors:
                raise WeightsError(f"tensor {name!r} is in more than one file of {src}")
            tensors[name] = arr
    return tensors


def _config_value(cfg: dict[str, Any], key: str, source: str) -> Any:
    if key not in cfg:
        raise WeightsError(f"{source} has no {key!r}; a Mixtral config.json needs it")
    return cfg[key]


def hf_model_config(cfg: dict[str, Any], source: str = "config.json") -> ModelConfig:
    """The engine's :class:`~.model.ModelConfig` for a Mixtral ``config.json`` (refused when
    the engine cannot run that architecture: grouped KV heads, tied embeddings, rope scaling...)."""
    archs = cfg.get("architectures") or []
    if cfg.get("model_type") != "mixtral" and "MixtralForCausalLM" not in archs:
        raise WeightsError(
            f"{source} is model_type {cfg.get('model_type')!r} ({archs}); the engine loads "
            "MixtralForCausalLM folders (`rollwire engine save-model --format hf`)"
        )
    d = int(_config_value(cfg, "hidden_size", source))
    heads = int(_config_value(cfg, "num_attention_heads", source))
    rope = cfg.get("rope_parameters") or {}
    checks = {
        "num_key_value_heads": (cfg.get("num_key_value_heads", heads), heads),
        "head_dim": (cfg.get("head_dim") or d // max(heads, 1), d // max(heads, 1)),
        "hidden_act": (cfg.get("hidden_act", "silu"), "silu"),
        "tie_word_embeddings": (bool(cfg.get("tie_word_embeddings", False)), False),
        "rope_scaling": (cfg.get("rope_scaling"), None),
        "rope_type": (rope.get("rope_type", "default"), "default"),
    }
    for key, (got, want) in checks.items():
        if got != want:
            raise WeightsError(f"{source} has {key} {got!r}; the engine's model needs {want!r}")
    try:
        return ModelConfig(
            vocab_size=int(_config_value(cfg, "vocab_size", source)),
            n_layers=int(_config_value(cfg, "num_hidden_layers", source)),
            d_model=d,
            n_heads=heads,
            n_experts=int(_config_value(cfg, "num_local_experts", source)),
            top_k=int(_config_value(cfg, "num_experts_per_tok", source)),
            expert_hidden=int(_config_value(cfg, "intermediate_size", source)),
            rope_theta=float(cfg.get("rope_theta", rope.get("rope_theta", 1e6))),
            max_model_len=int(cfg.get("max_position_embeddings", 8192)),
            norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        )
    except (TypeError, ValueError) as exc:
        raise WeightsError(f"{source} has a value the engine cannot use: {exc}") from exc


def _mixtral_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, h, E, V = cfg.d_model, cfg.expert_hidden, cfg.n_experts, cfg.vocab_size
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (V, d),
        "model.norm.weight": (d,),
        "lm_head.weight": (V, d),
    }
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (d,)
        for proj in ("q", "k", "v", "o"):
            out[f"{p}self_attn.{proj}_proj.weight"] = (d, d)
        out[p + "post_attention_layernorm.weight"] = (d,)
        out[p + "block_sparse_moe.gate.weight"] = (E, d)
        for e in range(E):
            q = f"{p}block_sparse_moe.experts.{e}."
            out[q + "w1.weight"] = (h, d)
            out[q + "w3.weight"] = (h, d)
            out[q + "w2.weight"] = (d, h)
    return out


def _check_mixtral(tensors: dict[str, np.ndarray], cfg: ModelConfig, source: str) -> None:
    want = _mixtral_shapes(cfg)
    missing = [k for k in want if k not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightsError(f"tensor {missing[0]!r} is missing from {source}{more}")
    extra = sorted(k for k in tensors if k not in want and not k.endswith(_IGNORED_SUFFIXES))
    if extra:
        raise WeightsError(
            f"{source} has tensor(s) the Mixtral config does not explain: {extra[:5]}"
        )
    for name, shape in want.items():
        if tensors[name].shape != shape:
            raise WeightsError(
                f"tensor {name!r} in {source} has shape {list(tensors[name].shape)}; "
                f"config.json implies {list(shape)}"
            )


def weights_from_mixtral(
    tensors: dict[str, np.ndarray], cfg: ModelConfig, source: str = "the checkpoint"
) -> _Weights:
    """The engine's weights from Mixtral-named tensors (exact inverse of ``mixtral_tensors``)."""
    _check_mixtral(tensors, cfg, source)
    L, E = cfg.n_layers, cfg.n_experts

    def layer(name: str) -> np.ndarray:
        return np.stack([tensors[f"model.layers.{i}.{name}"] for i in range(L)])

    def experts(w: str) -> np.ndarray:
        return np.stack(
            [
                np.stack(
                    [tensors[f"model.layers.{i}.block_sparse_moe.experts.{e}.{w}.weight"].T
                     for e in range(E)]
                )
                for i in range(L)
            ]
        )  # fmt: skip

    qkv = [
        np.concatenate(
            [tensors[f"model.layers.{i}.self_attn.{p}_proj.weight"].T for p in ("q", "k", "v")],
            axis=1,
        )
        for i in range(L)
    ]
    arrays = {
        "embed": tensors["model.embed_tokens.weight"],
        "attn_norm": layer("input_layernorm.weight"),
        "wqkv": np.stack(qkv),
        "wo": np.stack([tensors[f"model.layers.{i}.self_attn.o_proj.weight"].T for i in range(L)]),
        "ffn_norm": layer("post_attention_layernorm.weight"),
        "router": np.stack(
            [tensors[f"model.layers.{i}.block_sparse_moe.gate.weight"].T for i in range(L)]
        ),
        "w1": experts("w1"),
        "w3": experts("w3"),
        "w2": experts("w2"),
        "final_norm": tensors["model.norm.weight"],
        "lm_head": tensors["lm_head.weight"].T,
    }
    return _Weights.checked(arrays, cfg, source)


def load_hf(folder: str | Path, *, tokenizer: EngineTokenizer | None = None) -> TinyModel:
    """The engine model stored in a Mixtral folder (``config.json`` + safetensors), as written by
    :func:`.hf_export.save_hf`; ``tokenizer`` defaults to the folder's own (else the shipped one)."""
    src = Path(folder)
    config_path = src / "config.json"
    if not config_path.exists():
        raise WeightsError(f"{src} has no config.json; a Hugging Face model folder needs one")
    try:
        raw = json.loads(config_path.read_text())
    except ValueError as exc:
        raise WeightsError(f"{config_path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise WeightsError(f"{config_path} is not a JSON object")
    cfg = hf_model_config(raw, str(config_path))
    weights = weights_from_mixtral(read_tensors(src), cfg, str(src))
    if tokenizer is None:
        tokenizer = EngineTokenizer(src) if (src / "tokenizer.json").exists() else EngineTokenizer()
    try:
        return TinyModel(cfg, tokenizer, _weights=weights)
    except ValueError as exc:  # a shape the model cannot take (heads, vocab vs tokenizer)
        raise WeightsError(f"{config_path}: {exc}") from exc
