"""The embedded engine's model: a decoder-only transformer in NumPy float32.

One implementation serves both what the engine seeds itself (a toy mixture-of-experts model with
random weights: real logits, log-probs and routed experts, not sensible text) and the dense
Llama-family checkpoints :mod:`.hf_import` reads (Llama, Mistral, Qwen2, Qwen3): grouped-query
attention, tied embeddings, attention biases, per-head q/k RMSNorm and scaled RoPE are options of
:class:`ModelConfig`. Prefill and decode share one code path (a decode step is a one-token
prefill against the KV cache), so a teacher-forced pass reproduces sampled log-probs to float32
rounding.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from .model_config import KVCache, ModelConfig, WeightsError, rope_frequencies
from .tokenizer import EngineTokenizer, tokenizer_files

__all__ = ["KVCache", "ModelConfig", "TinyModel", "WeightsError", "rope_frequencies"]

_F32 = np.float32
#: Query rows per attention block in prefill; bounds the score matrix to ``heads x 256 x S``.
_QUERY_BLOCK = 256


@dataclass
class _Weights:
    """Every tensor, stacked over layers, in ``x @ W`` orientation (``[in, out]``); the
    options a config does not use are None."""

    embed: np.ndarray  # [V, d]
    attn_norm: np.ndarray  # [L, d]
    wqkv: np.ndarray  # [L, d, q + 2 kv]
    wo: np.ndarray  # [L, q, d]
    ffn_norm: np.ndarray  # [L, d]
    final_norm: np.ndarray  # [d]
    lm_head: np.ndarray  # [d, V]; a view of embed.T when tied
    router: np.ndarray | None = None  # [L, d, E]
    w1: np.ndarray | None = None  # [L, E, d, h]
    w3: np.ndarray | None = None  # [L, E, d, h]
    w2: np.ndarray | None = None  # [L, E, h, d]
    mlp_in: np.ndarray | None = None  # [L, d, 2h]: gate then up (dense)
    mlp_out: np.ndarray | None = None  # [L, h, d] (dense)
    bqkv: np.ndarray | None = None  # [L, q + 2 kv]
    bo: np.ndarray | None = None  # [L, d]
    q_norm: np.ndarray | None = None  # [L, head_dim]
    k_norm: np.ndarray | None = None  # [L, head_dim]

    @classmethod
    def init(cls, cfg: ModelConfig) -> _Weights:
        rng = np.random.default_rng(cfg.seed)
        d, L, E, h, V = cfg.d_model, cfg.n_layers, cfg.n_experts, cfg.expert_hidden, cfg.vocab_size
        q, kv = cfg.q_width, cfg.kv_width

        def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
            return (rng.standard_normal(shape) * std).astype(_F32)

        # The draw order of the default (Mixtral-shaped) model is fixed: seeds name weights.
        # A tied embedding is also the output head: scaled like one, or logits would be huge.
        embed = normal((V, d), cfg.logit_std * d**-0.5 if cfg.tie_embeddings else 1.0)
        wqkv = normal((L, d, q + 2 * kv), d**-0.5)
        # Half-scale residual branches keep the residual stream from blowing up with depth.
        wo = normal((L, q, d), 0.5 * q**-0.5)
        out: dict[str, Any] = {}
        if cfg.routed:
            # Sharper router logits so top-k choices are well separated (no near-ties).
            out["router"] = normal((L, d, E), 2.0 * d**-0.5)
            out["w1"] = normal((L, E, d, h), d**-0.5)
            out["w3"] = normal((L, E, d, h), d**-0.5)
            out["w2"] = normal((L, E, h, d), 0.5 * h**-0.5)
        else:
            out["mlp_in"] = normal((L, d, 2 * h), d**-0.5)
            out["mlp_out"] = normal((L, h, d), 0.5 * h**-0.5)
        lm_head = embed.T if cfg.tie_embeddings else normal((d, V), cfg.logit_std * d**-0.5)
        if cfg.qkv_bias:
            out["bqkv"] = normal((L, q + 2 * kv), 0.1)
        if cfg.o_bias:
            out["bo"] = normal((L, d), 0.1)
        if cfg.qk_norm:
            out["q_norm"] = np.ones((L, cfg.head_dim), _F32)
            out["k_norm"] = np.ones((L, cfg.head_dim), _F32)
        return cls(
            embed=embed,
            attn_norm=np.ones((L, d), _F32),
            wqkv=wqkv,
            wo=wo,
            ffn_norm=np.ones((L, d), _F32),
            final_norm=np.ones((d,), _F32),
            lm_head=lm_head,
            **out,
        )

    def arrays(self) -> dict[str, np.ndarray]:
        """The tensors a config uses (a tied ``lm_head`` is not one: it is ``embed``)."""
        tied = self.lm_head.base is not None and np.shares_memory(self.lm_head, self.embed)
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) is not None and not (tied and f.name == "lm_head")
        }

    @staticmethod
    def shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        d, L, E, h, V = cfg.d_model, cfg.n_layers, cfg.n_experts, cfg.expert_hidden, cfg.vocab_size
        q, kv = cfg.q_width, cfg.kv_width
        out: dict[str, tuple[int, ...]] = {
            "embed": (V, d),
            "attn_norm": (L, d),
            "wqkv": (L, d, q + 2 * kv),
            "wo": (L, q, d),
            "ffn_norm": (L, d),
        }
        if cfg.routed:
            out |= {"router": (L, d, E), "w1": (L, E, d, h), "w3": (L, E, d, h), "w2": (L, E, h, d)}
        else:
            out |= {"mlp_in": (L, d, 2 * h), "mlp_out": (L, h, d)}
        out["final_norm"] = (d,)
        if not cfg.tie_embeddings:
            out["lm_head"] = (d, V)
        if cfg.qkv_bias:
            out["bqkv"] = (L, q + 2 * kv)
        if cfg.o_bias:
            out["bo"] = (L, d)
        if cfg.qk_norm:
            out["q_norm"] = (L, cfg.head_dim)
            out["k_norm"] = (L, cfg.head_dim)
        return out

    @classmethod
    def checked(cls, arrays: dict[str, np.ndarray], cfg: ModelConfig, source: str) -> _Weights:
        """Weights from ``arrays`` after checking every name, shape and dtype against ``cfg``."""
        want = cls.shapes(cfg)
        missing = [k for k in want if k not in arrays]
        if missing:
            raise WeightsError(f"{source} has no tensor {missing[0]!r} (missing: {missing})")
        extra = sorted(set(arrays) - set(want))
        if extra:
            raise WeightsError(f"{source} has unexpected tensor(s) {extra}; expected {list(want)}")
        out: dict[str, np.ndarray] = {}
        for name, shape in want.items():
            arr = arrays[name]
            if arr.dtype not in (np.float32, np.float16):
                raise WeightsError(
                    f"tensor {name!r} in {source} is {arr.dtype}; expected float32 (or float16)"
                )
            if arr.shape != shape:
                raise WeightsError(
                    f"tensor {name!r} in {source} has shape {list(arr.shape)}; "
                    f"config.json implies {list(shape)}"
                )
            out[name] = np.ascontiguousarray(arr, dtype=_F32)
        if cfg.tie_embeddings:
            out["lm_head"] = out["embed"].T
        return cls(**out)


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return (x / np.sqrt(ms + _F32(eps))) * w


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (_F32(1.0) + np.exp(-x))


class TinyModel:
    """The embedded engine's language model: weights, KV cache, logits and routed experts."""

    def __init__(
        self,
        config: ModelConfig | None = None,
        tokenizer: EngineTokenizer | None = None,
        *,
        _weights: _Weights | None = None,
    ) -> None:
        self.tokenizer = tokenizer or EngineTokenizer()
        cfg = config or ModelConfig()
        if cfg.vocab_size == 0:
            cfg = replace(cfg, vocab_size=self.tokenizer.vocab_size)
        if cfg.vocab_size < self.tokenizer.vocab_size:
            raise ValueError(
                f"model vocab_size {cfg.vocab_size} is smaller than the tokenizer's {self.tokenizer.vocab_size}"
            )
        if (not cfg.head_size and cfg.d_model % cfg.n_heads) or cfg.head_dim % 2:
            raise ValueError(
                f"d_model {cfg.d_model} must split into {cfg.n_heads} heads of even width"
            )
        if cfg.n_heads % cfg.kv_heads:
            raise ValueError(
                f"{cfg.n_heads} query heads cannot share {cfg.kv_heads} key/value heads evenly"
            )
        if cfg.routed and not 0 < cfg.top_k <= cfg.n_experts:
            raise ValueError(f"top_k {cfg.top_k} must be in 1..{cfg.n_experts} (the experts)")
        self.config = cfg
        self.w = _weights or _Weights.init(cfg)
        self._inv_freq, self._rope_scale = rope_frequencies(cfg)
        half = cfg.head_dim // 2
        self._cos = np.zeros((0, half), _F32)
        self._sin = np.zeros((0, half), _F32)
        self._rope_table(256)
        self._scale = _F32(cfg.head_dim**-0.5)
        self._masks: dict[tuple[int, int], np.ndarray] = {}

    # ------------------------------------------------------------------ persistence
    def save(self, folder: str | Path) -> Path:
        """Write ``config.json``, ``weights.npz`` and a ``tokenizer/`` folder to ``folder``."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(asdict(self.config), indent=2))
        np.savez(out / "weights.npz", **self.w.arrays())  # type: ignore[arg-type]
        tok_out = out / "tokenizer"
        if tok_out.exists():
            shutil.rmtree(tok_out)
        tok_out.mkdir()
        for src in tokenizer_files(self.tokenizer.folder):  # not the weights of an HF folder
            shutil.copyfile(src, tok_out / src.name)
        return out

    @classmethod
    def load(cls, folder: str | Path, tokenizer: EngineTokenizer | None = None) -> TinyModel:
        """Load a folder written by :meth:`save` (``weights.npz``) or a Hugging Face folder
        (``*.safetensors``: Mixtral, Llama, Mistral, Qwen2, Qwen3; see
        :func:`rollwire.engine.hf_import.load_hf`).

        ``tokenizer`` replaces the folder's own; a bad folder raises :class:`WeightsError`.
        """
        src = Path(folder)
        if not src.is_dir():
            raise WeightsError(f"model folder {str(src)!r} does not exist or is not a folder")
        if not (src / "weights.npz").exists() and any(src.glob("*.safetensors")):
            from .hf_import import load_hf  # the HF reader imports this module

            return load_hf(src, tokenizer=tokenizer)
        if not (src / "config.json").exists():
            raise WeightsError(
                f"{src} has no config.json; write one with `rollwire engine save-model {src}`"
            )
        if not (src / "weights.npz").exists():
            raise WeightsError(
                f"{src} has neither weights.npz (the engine's format) nor *.safetensors "
                "(a Hugging Face folder); write one with `rollwire engine save-model`"
            )
        try:
            cfg = ModelConfig(**json.loads((src / "config.json").read_text()))
        except (TypeError, ValueError) as exc:
            raise WeightsError(f"{src}/config.json is not an engine model config: {exc}") from exc
        if tokenizer is None:
            tok_dir = src / "tokenizer"
            tokenizer = EngineTokenizer(tok_dir) if tok_dir.exists() else EngineTokenizer()
        if cfg.vocab_size == 0:
            cfg = replace(cfg, vocab_size=tokenizer.vocab_size)
        try:
            with np.load(src / "weights.npz", allow_pickle=False) as data:
                arrays = {k: np.asarray(data[k]) for k in data.files}
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise WeightsError(f"{src}/weights.npz cannot be read: {exc}") from exc
        weights = _Weights.checked(arrays, cfg, f"{src}/weights.npz")
        try:
            return cls(cfg, tokenizer, _weights=weights)
        except ValueError as exc:  # a shape the model cannot take (heads, vocab vs tokenizer)
            raise WeightsError(f"{src}/config.json: {exc}") from exc

    # ------------------------------------------------------------------ math
    def _rope_table(self, n: int) -> None:
        if n <= self._cos.shape[0]:
            return
        n = max(n, 2 * self._cos.shape[0])
        ang = np.arange(n, dtype=_F32)[:, None] * self._inv_freq[None, :]
        self._cos, self._sin = np.cos(ang).astype(_F32), np.sin(ang).astype(_F32)
        if self._rope_scale != 1.0:  # YaRN's attention factor scales cos and sin
            self._cos *= _F32(self._rope_scale)
            self._sin *= _F32(self._rope_scale)

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        # x: [N, H, hd], pos: [N]
        half = x.shape[-1] // 2
        cos = self._cos[pos][:, None, :]
        sin = self._sin[pos][:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def _attend(
        self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, cache: KVCache
    ) -> np.ndarray:
        """Causal attention of ``T`` new tokens (``q``: ``[T, H, hd]``, ``k``/``v``:
        ``[T, KV, hd]``) against ``cache``; returns ``[T, H * hd]``.

        Each key/value head serves ``G = H / KV`` query heads (grouped-query attention): their
        queries are stacked as rows ``t * G + g``, so one matmul per KV head covers the group.
        Queries run in blocks of ``_QUERY_BLOCK`` tokens: each block sees only the keys up to its
        last position, so memory is ``H x block x S`` floats instead of ``H x T x S`` and the
        masked upper triangle is never computed.
        """
        T, H, hd = q.shape
        KV = k.shape[1]
        G = H // KV
        start = cache.length
        end = start + T
        cache.k[layer, :, start:end] = k.transpose(1, 0, 2)
        cache.v[layer, :, start:end] = v.transpose(1, 0, 2)
        # [KV, T * G, hd]; with G == 1 this is q.transpose(1, 0, 2), as before GQA existed.
        qh = (q.reshape(T, KV, G, hd).transpose(1, 0, 2, 3) * self._scale).reshape(KV, T * G, hd)
        out = np.empty((T, H, hd), _F32)
        for a in range(0, T, _QUERY_BLOCK):
            b = min(a + _QUERY_BLOCK, T)
            stop = start + b  # keys 0..stop-1 are visible to some query of this block
            keys = cache.k[layer, :, :stop]  # [KV, S, hd]
            vals = cache.v[layer, :, :stop]
            s = np.matmul(qh[:, a * G : b * G], keys.transpose(0, 2, 1))  # [KV, B*G, S]
            if b - a > 1:
                # Query t (position start+a+t) sees keys up to start+a+t: mask the diagonal block.
                diag = s[:, :, start + a :]
                diag[:, self._causal_mask(b - a, G)] = -np.inf
            s -= s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            o = np.matmul(s, vals)  # [KV, B*G, hd]
            o /= s.sum(axis=-1, keepdims=True)
            out[a:b] = o.reshape(KV, b - a, G, hd).transpose(1, 0, 2, 3).reshape(b - a, H, hd)
        return out.reshape(T, -1)

    def _causal_mask(self, n: int, group: int) -> np.ndarray:
        m = self._masks.get((n, group))
        if m is None:
            m = np.repeat(np.triu(np.ones((n, n), dtype=bool), k=1), group, axis=0)
            self._masks[(n, group)] = m
        return m

    def _moe(self, layer: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Top-k mixture of experts over rows of ``x``; returns the output and the chosen experts."""
        cfg = self.config
        assert self.w.router is not None and self.w.w1 is not None
        assert self.w.w3 is not None and self.w.w2 is not None
        logits = x @ self.w.router[layer]  # [N, E]
        k = cfg.top_k
        top = np.argsort(-logits, axis=-1, kind="stable")[
            :, :k
        ]  # sorted by router score, like topk
        top_logits = np.take_along_axis(logits, top, axis=-1)
        gates = np.exp(top_logits - top_logits[:, :1])
        gates /= gates.sum(axis=-1, keepdims=True)
        out = np.zeros_like(x)
        w1, w3, w2 = self.w.w1[layer], self.w.w3[layer], self.w.w2[layer]
        if x.shape[0] == 1:
            for slot in range(k):
                e = int(top[0, slot])
                y = (_silu(x @ w1[e]) * (x @ w3[e])) @ w2[e]
                out += gates[0, slot] * y
        else:
            for e in np.unique(top):
                rows, slots = np.nonzero(top == e)
                xe = x[rows]
                y = (_silu(xe @ w1[e]) * (xe @ w3[e])) @ w2[e]
                np.add.at(out, rows, gates[rows, slots][:, None] * y)
        return out, top

    def _mlp(self, layer: int, x: np.ndarray) -> np.ndarray:
        """The dense SwiGLU feed-forward (gate and up projections fused in one matmul)."""
        assert self.w.mlp_in is not None and self.w.mlp_out is not None
        gate_up = self._proj(x, "mlp_in", layer)
        h = self.config.expert_hidden
        return self._proj(_silu(gate_up[:, :h]) * gate_up[:, h:], "mlp_out", layer)

    def _proj(self, x: np.ndarray, name: str, layer: int) -> np.ndarray:
        """``x @`` layer ``layer`` of the matrix ``name`` (a LoRA adapter adds its delta here)."""
        return x @ getattr(self.w, name)[layer]

    def _qkv(
        self, layer: int, x: np.ndarray, pos: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Queries ``[N, H, hd]``, keys and values ``[N, KV, hd]`` of rows ``x`` at ``pos``
        (normed, projected, q/k-normed where the model does, rotated)."""
        cfg, w = self.config, self.w
        N, H, KV, hd = x.shape[0], cfg.n_heads, cfg.kv_heads, cfg.head_dim
        qw, kw = cfg.q_width, cfg.kv_width
        h = _rmsnorm(x, w.attn_norm[layer], cfg.norm_eps)
        qkv = self._proj(h, "wqkv", layer)
        if w.bqkv is not None:
            qkv += w.bqkv[layer]
        q = qkv[:, :qw].reshape(N, H, hd)
        k = qkv[:, qw : qw + kw].reshape(N, KV, hd)
        v = qkv[:, qw + kw :].reshape(N, KV, hd)
        if w.q_norm is not None and w.k_norm is not None:
            q = _rmsnorm(q, w.q_norm[layer], cfg.norm_eps)
            k = _rmsnorm(k, w.k_norm[layer], cfg.norm_eps)
        return self._rope(q, pos), self._rope(k, pos), v

    def _after_attention(
        self, layer: int, x: np.ndarray, att: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The residual stream after the attention output ``att`` and the feed-forward, and the
        experts each row was routed to (``[N, top_k]``; ``[N, 0]`` for a dense model)."""
        cfg, w = self.config, self.w
        o = self._proj(att, "wo", layer)
        if w.bo is not None:
            o += w.bo[layer]
        x = x + o
        h = _rmsnorm(x, w.ffn_norm[layer], cfg.norm_eps)
        if cfg.routed:
            y, top = self._moe(layer, h)
        else:
            y, top = self._mlp(layer, h), np.zeros((x.shape[0], 0), np.int64)
        return x + y, top

    def _check_ids(self, ids: np.ndarray) -> None:
        V = self.config.vocab_size
        if ids.min() < 0 or ids.max() >= V:
            raise ValueError(f"token ids must be in [0, {V}); got {ids.min()}..{ids.max()}")

    def _logits(self, x: np.ndarray) -> np.ndarray:
        logits = _rmsnorm(x, self.w.final_norm, self.config.norm_eps) @ self.w.lm_head
        return logits.astype(_F32, copy=False)

    @property
    def _experts_per_token(self) -> int:
        return self.config.top_k if self.config.routed else 0

    def forward(
        self, token_ids: Sequence[int], cache: KVCache, *, logits_from: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Run ``token_ids`` after what ``cache`` holds; returns logits ``[T - logits_from, V]``
        (rows ``logits_from..T-1``) and experts ``[T, L, k]`` (``k`` is 0 for a dense model).

        The cache is extended in place. Skipping logits rows nobody reads saves the ``[T, V]``
        output projection on long prompts.
        """
        cfg = self.config
        ids = np.asarray(token_ids, dtype=np.int64)
        T = ids.shape[0]
        if T == 0:
            raise ValueError("forward needs at least one token")
        if cache.length + T > cfg.max_model_len:
            raise ValueError(
                f"sequence of {cache.length + T} tokens exceeds max_model_len {cfg.max_model_len}"
            )
        self._check_ids(ids)
        cache.reserve(T)
        self._rope_table(cache.length + T)
        pos = np.arange(cache.length, cache.length + T)
        x = self.w.embed[ids]
        experts = np.zeros((T, cfg.n_layers, self._experts_per_token), np.int32)
        for layer in range(cfg.n_layers):
            q, k, v = self._qkv(layer, x, pos)
            x, experts[:, layer] = self._after_attention(
                layer, x, self._attend(layer, q, k, v, cache)
            )
        cache.length += T
        return self._logits(x[max(0, min(logits_from, T)) :]), experts

    def decode_batch(
        self, token_ids: Sequence[int], caches: Sequence[KVCache]
    ) -> tuple[np.ndarray, np.ndarray]:
        """One decode step for several sequences at once (one new token each).

        Projections and the feed-forward run batched; attention runs per sequence against its
        own cache with the same function as prefill, so each row equals a one-sequence
        :meth:`forward` up to float32 rounding.
        """
        cfg = self.config
        B = len(caches)
        ids = np.asarray(token_ids, dtype=np.int64)
        self._check_ids(ids)
        for c in caches:
            c.reserve(1)
        pos = np.array([c.length for c in caches])
        if pos.max() + 1 > cfg.max_model_len:
            raise ValueError(f"a sequence exceeds max_model_len {cfg.max_model_len}")
        self._rope_table(int(pos.max()) + 1)
        x = self.w.embed[ids]
        experts = np.zeros((B, cfg.n_layers, self._experts_per_token), np.int32)
        for layer in range(cfg.n_layers):
            q, k, v = self._qkv(layer, x, pos)
            att = np.concatenate(
                [
                    self._attend(layer, q[b : b + 1], k[b : b + 1], v[b : b + 1], caches[b])
                    for b in range(B)
                ]
            )
            x, experts[:, layer] = self._after_attention(layer, x, att)
        for c in caches:
            c.length += 1
        return self._logits(x), experts

    def new_cache(self, capacity: int = 64) -> KVCache:
        """An empty KV cache for this model."""
        return KVCache.empty(self.config, capacity)

    def prefill(self, token_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray, KVCache]:
        """Forward a whole sequence from scratch: per-position logits, routed experts and the cache."""
        cache = self.new_cache(max(64, len(token_ids) + 64))
        logits, experts = self.forward(token_ids, cache)
        return logits, experts, cache
