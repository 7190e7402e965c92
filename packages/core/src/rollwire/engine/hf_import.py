"""A Hugging Face model folder read into the engine's model, without torch: Mixtral (the inverse
of :mod:`.hf_export`, routed experts included) and the dense Llama family — Llama, Mistral,
Qwen2, Qwen3 (grouped-query attention, tied embeddings, attention biases, q/k norm, scaled RoPE).

safetensors is parsed by hand, as :func:`.hf_export.write_safetensors` writes it: an 8-byte
little-endian header length, a JSON header naming each tensor's dtype, shape and byte range, then
raw little-endian data. F32 is read as is; F16 and BF16 are widened to float32 (exactly). Every
problem is a :class:`~.model.WeightsError` naming the file, tensor or config key.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .model import ModelConfig, TinyModel, WeightsError, _Weights
from .model_config import ROPE_TYPES
from .tokenizer import EngineTokenizer

__all__ = [
    "MODEL_TYPES",
    "hf_model_config",
    "hf_shapes",
    "load_hf",
    "read_safetensors",
    "read_tensors",
    "weights_from_hf",
]

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


@dataclass(frozen=True)
class _Family:
    """What one ``model_type`` fixes: its class, feed-forward and biases, and the defaults its
    transformers config class fills in for keys a ``config.json`` leaves out."""

    architecture: str
    moe: bool = False
    #: q/k/v biases always (Qwen2), or per ``attention_bias`` (None).
    qkv_bias: bool | None = None
    #: o_proj bias per ``attention_bias`` (Llama, Qwen3), or never.
    o_bias_from_config: bool = False
    qk_norm: bool = False
    #: The config has ``use_sliding_window`` (Qwen) rather than ``sliding_window`` alone.
    sliding_flag: bool = False
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048


_FAMILIES = {
    "mixtral": _Family(
        "MixtralForCausalLM", moe=True, qkv_bias=False, rope_theta=1e6, rms_norm_eps=1e-5,
        max_position_embeddings=4096 * 32,
    ),
    "llama": _Family("LlamaForCausalLM", o_bias_from_config=True),
    "mistral": _Family(
        "MistralForCausalLM", qkv_bias=False, max_position_embeddings=4096 * 32
    ),
    "qwen2": _Family(
        "Qwen2ForCausalLM", qkv_bias=True, sliding_flag=True, max_position_embeddings=32768
    ),
    "qwen3": _Family(
        "Qwen3ForCausalLM", o_bias_from_config=True, qk_norm=True, sliding_flag=True,
        max_position_embeddings=32768,
    ),
}  # fmt: skip
#: The ``model_type`` values :func:`hf_model_config` reads.
MODEL_TYPES = tuple(_FAMILIES)


def _config_value(cfg: dict[str, Any], key: str, source: str) -> Any:
    if key not in cfg:
        raise WeightsError(f"{source} has no {key!r}; the engine needs it")
    return cfg[key]


def _family(cfg: dict[str, Any], source: str) -> tuple[str, _Family]:
    archs = cfg.get("architectures") or []
    model_type = cfg.get("model_type")
    if model_type not in _FAMILIES:
        by_arch = {f.architecture: name for name, f in _FAMILIES.items()}
        model_type = next((by_arch[a] for a in archs if a in by_arch), None)
    if model_type is None:
        supported = ", ".join(f.architecture for f in _FAMILIES.values())
        raise WeightsError(
            f"{source} is model_type {cfg.get('model_type')!r} ({archs}); the engine loads "
            f"{supported} folders (serve other models with vLLM and --backend)"
        )
    return model_type, _FAMILIES[model_type]


def _rope(cfg: dict[str, Any], family: _Family, source: str) -> tuple[float, dict[str, Any] | None]:
    """``rope_theta`` and the scaling parameters, from transformers 5's ``rope_parameters`` or
    the older top-level ``rope_theta`` + ``rope_scaling``."""
    params = {**(cfg.get("rope_scaling") or {}), **(cfg.get("rope_parameters") or {})}
    theta = float(params.pop("rope_theta", cfg.get("rope_theta", family.rope_theta)))
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    partial = params.pop("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise WeightsError(
            f"{source} has partial_rotary_factor {partial!r}; the engine rotates whole heads (1.0)"
        )
    if kind not in ROPE_TYPES:
        raise WeightsError(
            f"{source} has rope_type {kind!r}; the engine computes {', '.join(ROPE_TYPES)}"
        )
    if kind == "default":
        return theta, None
    max_len = cfg.get("max_position_embeddings") or family.max_position_embeddings
    if kind in ("llama3", "yarn"):
        # transformers fills it in from max_position_embeddings when a config leaves it out
        params.setdefault("original_max_position_embeddings", max_len)
    if kind == "yarn" and params.get("factor") is None:
        # resolved here: a served --max-model-len must not change the frequencies
        params["factor"] = max_len / params["original_max_position_embeddings"]
    need = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor")}
    missing = [k for k in need.get(kind, ()) if params.get(k) is None]
    if missing:
        raise WeightsError(f"{source}: rope_type {kind!r} needs {missing[0]!r} in its parameters")
    return theta, {"rope_type": kind, **params}


def hf_model_config(cfg: dict[str, Any], source: str = "config.json") -> ModelConfig:
    """The engine's :class:`~.model.ModelConfig` for a Hugging Face ``config.json`` of one of
    :data:`MODEL_TYPES`; what the engine cannot run exactly (sliding windows, another activation,
    MLP biases, partial rotary) is refused, naming the key."""
    model_type, family = _family(cfg, source)
    d = int(_config_value(cfg, "hidden_size", source))
    heads = int(_config_value(cfg, "num_attention_heads", source))
    max_len = int(cfg.get("max_position_embeddings") or family.max_position_embeddings)
    checks: dict[str, tuple[Any, Any]] = {
        "hidden_act": (cfg.get("hidden_act", "silu"), "silu"),
        "mlp_bias": (bool(cfg.get("mlp_bias", False)), False),
    }
    if family.sliding_flag:
        checks["use_sliding_window"] = (bool(cfg.get("use_sliding_window", False)), False)
    else:
        checks["sliding_window"] = (cfg.get("sliding_window"), None)
    layer_types = cfg.get("layer_types")
    if layer_types and set(layer_types) != {"full_attention"}:
        checks["layer_types"] = (sorted(set(layer_types)), ["full_attention"])
    for key, (got, want) in checks.items():
        if got != want:
            raise WeightsError(f"{source} has {key} {got!r}; the engine's model needs {want!r}")
    theta, scaling = _rope(cfg, family, source)
    attention_bias = bool(cfg.get("attention_bias", False))
    head_dim = cfg.get("head_dim") or d // max(heads, 1)
    try:
        return ModelConfig(
            vocab_size=int(_config_value(cfg, "vocab_size", source)),
            n_layers=int(_config_value(cfg, "num_hidden_layers", source)),
            d_model=d,
            n_heads=heads,
            n_experts=int(_config_value(cfg, "num_local_experts", source)) if family.moe else 0,
            top_k=int(_config_value(cfg, "num_experts_per_tok", source)) if family.moe else 0,
            expert_hidden=int(_config_value(cfg, "intermediate_size", source)),
            rope_theta=theta,
            max_model_len=max_len,
            norm_eps=float(cfg.get("rms_norm_eps", family.rms_norm_eps)),
            n_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_size=int(head_dim),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=attention_bias if family.qkv_bias is None else family.qkv_bias,
            o_bias=attention_bias and family.o_bias_from_config,
            qk_norm=family.qk_norm,
            rope_scaling=scaling,
            model_type=model_type,
        )
    except (TypeError, ValueError) as exc:
        raise WeightsError(f"{source} has a value the engine cannot use: {exc}") from exc


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Hugging Face folder of shape ``cfg`` holds (``nn.Linear``: ``[out, in]``)."""
    d, h, E, V = cfg.d_model, cfg.expert_hidden, cfg.n_experts, cfg.vocab_size
    q, kv = cfg.q_width, cfg.kv_width
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (V, d),
        "model.norm.weight": (d,),
    }
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = (V, d)
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (d,)
        for proj, rows in (("q", q), ("k", kv), ("v", kv)):
            out[f"{p}self_attn.{proj}_proj.weight"] = (rows, d)
            if cfg.qkv_bias:
                out[f"{p}self_attn.{proj}_proj.bias"] = (rows,)
        out[p + "self_attn.o_proj.weight"] = (d, q)
        if cfg.o_bias:
            out[p + "self_attn.o_proj.bias"] = (d,)
        if cfg.qk_norm:
            out[p + "self_attn.q_norm.weight"] = (cfg.head_dim,)
            out[p + "self_attn.k_norm.weight"] = (cfg.head_dim,)
        out[p + "post_attention_layernorm.weight"] = (d,)
        if cfg.routed:
            out[p + "block_sparse_moe.gate.weight"] = (E, d)
            for e in range(E):
                x = f"{p}block_sparse_moe.experts.{e}."
                out[x + "w1.weight"] = (h, d)
                out[x + "w3.weight"] = (h, d)
                out[x + "w2.weight"] = (d, h)
        else:
            out[p + "mlp.gate_proj.weight"] = (h, d)
            out[p + "mlp.up_proj.weight"] = (h, d)
            out[p + "mlp.down_proj.weight"] = (d, h)
    return out


def _check(tensors: dict[str, np.ndarray], cfg: ModelConfig, source: str) -> None:
    want = hf_shapes(cfg)
    missing = [k for k in want if k not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightsError(f"tensor {missing[0]!r} is missing from {source}{more}")
    # a tied checkpoint may still carry lm_head.weight (a copy of the embedding): it is unused
    optional = ("lm_head.weight",) if cfg.tie_embeddings else ()
    extra = sorted(
        k
        for k in tensors
        if k not in want and k not in optional and not k.endswith(_IGNORED_SUFFIXES)
    )
    if extra:
        raise WeightsError(
            f"{source} has tensor(s) its config.json ({cfg.model_type}) does not explain: {extra[:5]}"
        )
    for name, shape in want.items():
        if tensors[name].shape != shape:
            raise WeightsError(
                f"tensor {name!r} in {source} has shape {list(tensors[name].shape)}; "
                f"config.json implies {list(shape)}"
            )


def _stacked(parts: list[np.ndarray]) -> np.ndarray:
    """``np.stack`` into one C-contiguous float32 array, copying each (maybe transposed) part
    once (``np.stack`` of transposed views keeps their layout, and the model then copies again)."""
    out = np.empty((len(parts), *parts[0].shape), _F32)
    for i, part in enumerate(parts):
        # transposed in a small temporary first: scattered writes into fresh pages are slow
        out[i] = np.ascontiguousarray(part)
    return out


def weights_from_hf(
    tensors: dict[str, np.ndarray], cfg: ModelConfig, source: str = "the checkpoint"
) -> _Weights:
    """The engine's weights from Hugging Face-named tensors (the exact inverse of
    :func:`.hf_export.hf_tensors`); ``tensors`` is emptied as they are used, to bound memory."""
    _check(tensors, cfg, source)
    L, E = cfg.n_layers, cfg.n_experts

    def take(name: str) -> np.ndarray:
        return tensors.pop(name)

    def stack(name: str, transpose: bool = False) -> np.ndarray:
        parts = [take(f"model.layers.{i}.{name}") for i in range(L)]
        return _stacked([t.T for t in parts] if transpose else parts)

    def side_by_side(names: list[str]) -> np.ndarray:
        """Layer tensors ``names`` (``[out, in]`` or ``[out]``) transposed and concatenated
        along their output axis: ``[L, in, sum of outs]`` (or ``[L, sum of outs]``)."""
        first = [tensors[f"model.layers.0.{n}"] for n in names]
        width = sum(t.shape[0] for t in first)
        out = np.empty((L, *first[0].shape[1:], width), _F32)
        for i in range(L):
            at = 0
            for n in names:
                t = take(f"model.layers.{i}.{n}")
                out[i, ..., at : at + t.shape[0]] = np.ascontiguousarray(t.T)
                at += t.shape[0]
        return out

    def cat(kind: str) -> np.ndarray:  # q, k and v side by side: [L, d, q + 2 kv] or [L, q + 2 kv]
        return side_by_side([f"self_attn.{p}_proj.{kind}" for p in "qkv"])

    arrays: dict[str, np.ndarray] = {
        "embed": take("model.embed_tokens.weight"),
        "attn_norm": stack("input_layernorm.weight"),
        "wqkv": cat("weight"),
        "wo": stack("self_attn.o_proj.weight", transpose=True),
        "ffn_norm": stack("post_attention_layernorm.weight"),
        "final_norm": take("model.norm.weight"),
    }
    if not cfg.tie_embeddings:
        arrays["lm_head"] = take("lm_head.weight").T
    if cfg.qkv_bias:
        arrays["bqkv"] = cat("bias")
    if cfg.o_bias:
        arrays["bo"] = stack("self_attn.o_proj.bias")
    if cfg.qk_norm:
        arrays["q_norm"] = stack("self_attn.q_norm.weight")
        arrays["k_norm"] = stack("self_attn.k_norm.weight")
    if cfg.routed:

        def experts(w: str) -> np.ndarray:
            return _stacked(
                [
                    _stacked(
                        [take(f"model.layers.{i}.block_sparse_moe.experts.{e}.{w}.weight").T
                         for e in range(E)]
                    )
                    for i in range(L)
                ]
            )  # fmt: skip

        arrays["router"] = stack("block_sparse_moe.gate.weight", transpose=True)
        arrays["w1"] = experts("w1")
        arrays["w3"] = experts("w3")
        arrays["w2"] = experts("w2")
    else:
        arrays["mlp_in"] = side_by_side(["mlp.gate_proj.weight", "mlp.up_proj.weight"])
        arrays["mlp_out"] = stack("mlp.down_proj.weight", transpose=True)
    return _Weights.checked(arrays, cfg, source)


def load_hf(folder: str | Path, *, tokenizer: EngineTokenizer | None = None) -> TinyModel:
    """The model stored in a Hugging Face folder (``config.json`` + safetensors) of one of
    :data:`MODEL_TYPES`; ``tokenizer`` defaults to the folder's own (else the shipped one)."""
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
    weights = weights_from_hf(read_tensors(src), cfg, str(src))
    if tokenizer is None:
        tokenizer = EngineTokenizer(src) if (src / "tokenizer.json").exists() else EngineTokenizer()
    try:
        return TinyModel(cfg, tokenizer, _weights=weights)
    except ValueError as exc:  # a shape the model cannot take (heads, vocab vs tokenizer)
        raise WeightsError(f"{config_path}: {exc}") from exc
