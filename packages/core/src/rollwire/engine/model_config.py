"""The embedded engine model's shape (:class:`ModelConfig`: the seeded toy MoE model or a dense
Llama-family checkpoint's), its RoPE frequencies as transformers computes them, and the
per-sequence :class:`KVCache`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ROPE_TYPES", "KVCache", "ModelConfig", "WeightsError", "rope_frequencies"]

_F32 = np.float32
#: RoPE scaling types :func:`rope_frequencies` computes (transformers' names).
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class WeightsError(ValueError):
    """A model folder that cannot be served: names the file, tensor or key and what was expected."""


@dataclass(frozen=True)
class ModelConfig:
    """Shape, options and seed of :class:`TinyModel`; ``vocab_size`` follows the tokenizer when 0.

    The defaults are the engine's seeded toy model (Mixtral's layout). ``n_experts=0`` makes the
    feed-forward a dense SwiGLU MLP of width ``expert_hidden`` (Llama, Qwen); ``n_kv_heads`` and
    ``head_size`` of 0 mean "as many as query heads" and ``d_model // n_heads``.
    """

    vocab_size: int = 0
    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    n_experts: int = 8
    top_k: int = 2
    expert_hidden: int = 64
    rope_theta: float = 10000.0
    max_model_len: int = 8192
    norm_eps: float = 1e-6
    #: Target std of the output logits; random models need a few units to give non-flat
    #: distributions (and interesting log-probs).
    logit_std: float = 3.0
    seed: int = 0
    model_name: str = "rollwire-tiny"
    #: Key/value heads (grouped-query attention when fewer than ``n_heads``); 0: ``n_heads``.
    n_kv_heads: int = 0
    #: Per-head width; 0: ``d_model // n_heads`` (Qwen3 sets it apart from ``d_model``).
    head_size: int = 0
    #: The output projection is the token embedding (``tie_word_embeddings``).
    tie_embeddings: bool = False
    #: Biases on the q/k/v projections (Qwen2; Llama's ``attention_bias``).
    qkv_bias: bool = False
    #: A bias on the attention output projection (Llama's and Qwen3's ``attention_bias``).
    o_bias: bool = False
    #: Per-head RMSNorm of queries and keys before RoPE (Qwen3).
    qk_norm: bool = False
    #: transformers' RoPE parameters besides ``rope_theta`` (``rope_type`` one of
    #: :data:`ROPE_TYPES`, ``factor``...); None: plain RoPE.
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    #: The Hugging Face ``model_type`` this shape comes from (what ``save_hf`` writes).
    model_type: str = "mixtral"

    @property
    def head_dim(self) -> int:
        """Per-head width."""
        return self.head_size or self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads."""
        return self.n_kv_heads or self.n_heads

    @property
    def q_width(self) -> int:
        """Width of the concatenated query heads."""
        return self.n_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of the concatenated key (or value) heads."""
        return self.kv_heads * self.head_dim

    @property
    def routed(self) -> bool:
        """Whether the feed-forward is a mixture of experts (with routed experts to report)."""
        return self.n_experts > 0

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache memory of one token (float32 keys and values of every layer)."""
        return 2 * self.n_layers * self.kv_width * 4


def rope_frequencies(cfg: ModelConfig) -> tuple[np.ndarray, float]:
    """RoPE inverse frequencies (float32, ``head_dim // 2``) and the cos/sin scale, as
    transformers' ``ROPE_INIT_FUNCTIONS`` compute them for ``cfg.rope_scaling``."""
    dim = cfg.head_dim
    base = cfg.rope_theta
    inv = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    params = dict(cfg.rope_scaling or {})
    kind = params.get("rope_type") or params.get("type") or "default"
    scale = 1.0
    if kind == "default":
        pass
    elif kind == "linear":
        inv = inv / float(params["factor"])
    elif kind == "llama3":
        factor = float(params["factor"])
        low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
        old_len = float(params["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old_len / low, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
        inv = np.where(medium, smoothed, scaled)
    elif kind == "yarn":
        inv, scale = _yarn(cfg, params)
    else:
        raise ValueError(f"rope_type {kind!r} is not one the engine computes ({ROPE_TYPES})")
    return inv.astype(_F32), scale


def _yarn(cfg: ModelConfig, params: dict[str, Any]) -> tuple[np.ndarray, float]:
    """transformers' ``_compute_yarn_parameters`` (YaRN: NTK-by-parts plus an attention scale)."""
    dim, base = cfg.head_dim, cfg.rope_theta
    orig = float(params.get("original_max_position_embeddings") or cfg.max_model_len)
    factor = params.get("factor")
    factor = float(factor) if factor is not None else cfg.max_model_len / orig

    def mscale(s: float, m: float = 1.0) -> float:
        return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

    attention = params.get("attention_factor")
    if attention is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    fast, slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def correction(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    lo, hi = correction(fast), correction(slow)
    if params.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
    pos = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    extrapolation = 1 - ramp
    inv = (1.0 / (factor * pos)) * (1 - extrapolation) + (1.0 / pos) * extrapolation
    return inv, float(attention)


@dataclass
class KVCache:
    """Per-sequence key/value cache, ``[layers, kv_heads, capacity, head_dim]``, grown by doubling."""

    k: np.ndarray
    v: np.ndarray
    length: int = 0

    @classmethod
    def empty(cls, cfg: ModelConfig, capacity: int = 64) -> KVCache:
        """An empty cache sized for ``capacity`` tokens."""
        shape = (cfg.n_layers, cfg.kv_heads, capacity, cfg.head_dim)
        return cls(np.zeros(shape, _F32), np.zeros(shape, _F32), 0)

    def reserve(self, n: int) -> None:
        """Make room for ``n`` more tokens."""
        need = self.length + n
        cap = self.k.shape[2]
        if need <= cap:
            return
        new_cap = max(need, cap * 2)
        shape = (*self.k.shape[:2], new_cap, self.k.shape[3])
        k = np.zeros(shape, _F32)
        v = np.zeros(shape, _F32)
        k[:, :, : self.length] = self.k[:, :, : self.length]
        v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v = k, v
