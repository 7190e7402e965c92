"""A seeded decoder-only mixture-of-experts transformer in NumPy float32 (the embedded engine's model).

Random weights: it produces real logits, log-probs and routed experts, not sensible text. Prefill
and decode share one code path (a decode step is a one-token prefill against the KV cache), so a
teacher-forced pass reproduces sampled log-probs to float32 rounding.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from .tokenizer import EngineTokenizer, tokenizer_files

__all__ = ["KVCache", "ModelConfig", "TinyModel", "WeightsError"]

_F32 = np.float32
#: Query rows per attention block in prefill; bounds the score matrix to ``heads x 256 x S``.
_QUERY_BLOCK = 256


class WeightsError(ValueError):
    """A model folder that cannot be served: names the file, tensor or key and what was expected."""


@dataclass(frozen=True)
class ModelConfig:
    """Shape and seed of :class:`TinyModel`; ``vocab_size`` follows the tokenizer when 0."""

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

    @property
    def head_dim(self) -> int:
        """Per-head width."""
        return self.d_model // self.n_heads


@dataclass
class KVCache:
    """Per-sequence key/value cache, ``[layers, heads, capacity, head_dim]``, grown by doubling."""

    k: np.ndarray
    v: np.ndarray
    length: int = 0

    @classmethod
    def empty(cls, cfg: ModelConfig, capacity: int = 64) -> KVCache:
        """An empty cache sized for ``capacity`` tokens."""
        shape = (cfg.n_layers, cfg.n_heads, capacity, cfg.head_dim)
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


@dataclass
class _Weights:
    embed: np.ndarray
    attn_norm: np.ndarray  # [L, d]
    wqkv: np.ndarray  # [L, d, 3d]
    wo: np.ndarray  # [L, d, d]
    ffn_norm: np.ndarray  # [L, d]
    router: np.ndarray  # [L, d, E]
    w1: np.ndarray  # [L, E, d, h]
    w3: np.ndarray  # [L, E, d, h]
    w2: np.ndarray  # [L, E, h, d]
    final_norm: np.ndarray  # [d]
    lm_head: np.ndarray  # [d, V]

    @classmethod
    def init(cls, cfg: ModelConfig) -> _Weights:
        rng = np.random.default_rng(cfg.seed)
        d, L, E, h, V = cfg.d_model, cfg.n_layers, cfg.n_experts, cfg.expert_hidden, cfg.vocab_size

        def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
            return (rng.standard_normal(shape) * std).astype(_F32)

        return cls(
            embed=normal((V, d), 1.0),
            attn_norm=np.ones((L, d), _F32),
            wqkv=normal((L, d, 3 * d), d**-0.5),
            # Half-scale residual branches keep the residual stream from blowing up with depth.
            wo=normal((L, d, d), 0.5 * d**-0.5),
            ffn_norm=np.ones((L, d), _F32),
            # Sharper router logits so top-k choices are well separated (no near-ties).
            router=normal((L, d, E), 2.0 * d**-0.5),
            w1=normal((L, E, d, h), d**-0.5),
            w3=normal((L, E, d, h), d**-0.5),
            w2=normal((L, E, h, d), 0.5 * h**-0.5),
            final_norm=np.ones((d,), _F32),
            lm_head=normal((d, V), cfg.logit_std * d**-0.5),
        )

    def arrays(self) -> dict[str, np.ndarray]:
        return dict(vars(self))

    @staticmethod
    def shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        d, L, E, h, V = cfg.d_model, cfg.n_layers, cfg.n_experts, cfg.expert_hidden, cfg.vocab_size
        return {
            "embed": (V, d),
            "attn_norm": (L, d),
            "wqkv": (L, d, 3 * d),
            "wo": (L, d, d),
            "ffn_norm": (L, d),
            "router": (L, d, E),
            "w1": (L, E, d, h),
            "w3": (L, E, d, h),
            "w2": (L, E, h, d),
            "final_norm": (d,),
            "lm_head": (d, V),
        }

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
        return cls(**out)


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return (x / np.sqrt(ms + _F32(eps))) * w


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (_F32(1.0) + np.exp(-x))


class TinyModel:
    """The embedded engine's language model: seeded weights, KV cache, logits and routed experts."""

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
            cfg = ModelConfig(**{**asdict(cfg), "vocab_size": self.tokenizer.vocab_size})
        if cfg.vocab_size < self.tokenizer.vocab_size:
            raise ValueError(
                f"model vocab_size {cfg.vocab_size} is smaller than the tokenizer's {self.tokenizer.vocab_size}"
            )
        if cfg.d_model % cfg.n_heads or cfg.head_dim % 2:
            raise ValueError(
                f"d_model {cfg.d_model} must split into {cfg.n_heads} heads of even width"
            )
        self.config = cfg
        self.w = _weights or _Weights.init(cfg)
        half = cfg.head_dim // 2
        self._inv_freq = (
            1.0 / (cfg.rope_theta ** (np.arange(half, dtype=np.float64) / half))
        ).astype(_F32)
        self._cos = np.zeros((0, half), _F32)
        self._sin = np.zeros((0, half), _F32)
        self._rope_table(256)
        self._scale = _F32(cfg.head_dim**-0.5)
        self._masks: dict[int, np.ndarray] = {}

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
        """Load a folder written by :meth:`save` (``weights.npz``) or a Hugging Face Mixtral
        folder (``*.safetensors``, see :func:`rollwire.engine.hf_import.load_hf`).

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
        """Causal attention of ``T`` new tokens (``[T, H, hd]``) against ``cache``; returns ``[T, d]``.

        Queries run in blocks of ``_QUERY_BLOCK``: each block sees only the keys up to its last
        position, so memory is ``H x block x S`` floats instead of ``H x T x S`` and the masked
        upper triangle is never computed.
        """
        T = q.shape[0]
        start = cache.length
        end = start + T
        cache.k[layer, :, start:end] = k.transpose(1, 0, 2)
        cache.v[layer, :, start:end] = v.transpose(1, 0, 2)
        qh = q.transpose(1, 0, 2) * self._scale  # [H, T, hd]
        out = np.empty((T, q.shape[1], q.shape[2]), _F32)
        for a in range(0, T, _QUERY_BLOCK):
            b = min(a + _QUERY_BLOCK, T)
            stop = start + b  # keys 0..stop-1 are visible to some query of this block
            keys = cache.k[layer, :, :stop]  # [H, S, hd]
            vals = cache.v[layer, :, :stop]
            s = np.matmul(qh[:, a:b], keys.transpose(0, 2, 1))  # [H, B, S]
            if b - a > 1:
                # Query i (position start+a+i) sees keys up to start+a+i: mask the diagonal block.
                diag = s[:, :, start + a :]
                diag[:, self._causal_mask(b - a)] = -np.inf
            s -= s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            o = np.matmul(s, vals)  # [H, B, hd]
            o /= s.sum(axis=-1, keepdims=True)
            out[a:b] = o.transpose(1, 0, 2)
        return out.reshape(T, -1)

    def _causal_mask(self, n: int) -> np.ndarray:
        m = self._masks.get(n)
        if m is None:
            m = np.triu(np.ones((n, n), dtype=bool), k=1)
            self._masks[n] = m
        return m

    def _moe(self, layer: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Top-k mixture of experts over rows of ``x``; returns the output and the chosen experts."""
        cfg = self.config
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

    def forward(
        self, token_ids: Sequence[int], cache: KVCache, *, logits_from: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Run ``token_ids`` after what ``cache`` holds; returns logits ``[T - logits_from, V]``
        (rows ``logits_from..T-1``) and experts ``[T, L, k]``.

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
        if ids.min() < 0 or ids.max() >= cfg.vocab_size:
            raise ValueError(
                f"token ids must be in [0, {cfg.vocab_size}); got {ids.min()}..{ids.max()}"
            )
        cache.reserve(T)
        self._rope_table(cache.length + T)
        pos = np.arange(cache.length, cache.length + T)
        H, hd, d = cfg.n_heads, cfg.head_dim, cfg.d_model
        x = self.w.embed[ids]
        experts = np.zeros((T, cfg.n_layers, cfg.top_k), np.int32)
        for layer in range(cfg.n_layers):
            h = _rmsnorm(x, self.w.attn_norm[layer], cfg.norm_eps)
            qkv = h @ self.w.wqkv[layer]
            q = self._rope(qkv[:, :d].reshape(T, H, hd), pos)
            k = self._rope(qkv[:, d : 2 * d].reshape(T, H, hd), pos)
            v = qkv[:, 2 * d :].reshape(T, H, hd)
            x = x + self._attend(layer, q, k, v, cache) @ self.w.wo[layer]
            h = _rmsnorm(x, self.w.ffn_norm[layer], cfg.norm_eps)
            y, top = self._moe(layer, h)
            experts[:, layer] = top
            x = x + y
        cache.length += T
        x = x[max(0, min(logits_from, T)) :]
        logits = _rmsnorm(x, self.w.final_norm, cfg.norm_eps) @ self.w.lm_head
        return logits.astype(_F32, copy=False), experts

    def decode_batch(
        self, token_ids: Sequence[int], caches: Sequence[KVCache]
    ) -> tuple[np.ndarray, np.ndarray]:
        """One decode step for several sequences at once (one new token each).

        Projections and experts run batched; attention runs per sequence against its own cache
        with the same function as prefill, so each row equals a one-sequence :meth:`forward`
        up to float32 rounding.
        """
        cfg = self.config
        B = len(caches)
        ids = np.asarray(token_ids, dtype=np.int64)
        for c in caches:
            c.reserve(1)
        pos = np.array([c.length for c in caches])
        if pos.max() + 1 > cfg.max_model_len:
            raise ValueError(f"a sequence exceeds max_model_len {cfg.max_model_len}")
        self._rope_table(int(pos.max()) + 1)
        H, hd, d = cfg.n_heads, cfg.head_dim, cfg.d_model
        x = self.w.embed[ids]
        experts = np.zeros((B, cfg.n_layers, cfg.top_k), np.int32)
        for layer in range(cfg.n_layers):
            h = _rmsnorm(x, self.w.attn_norm[layer], cfg.norm_eps)
            qkv = h @ self.w.wqkv[layer]
            q = self._rope(qkv[:, :d].reshape(B, H, hd), pos)
            k = self._rope(qkv[:, d : 2 * d].reshape(B, H, hd), pos)
            v = qkv[:, 2 * d :].reshape(B, H, hd)
            att = np.concatenate(
                [
                    self._attend(layer, q[b : b + 1], k[b : b + 1], v[b : b + 1], caches[b])
                    for b in range(B)
                ]
            )
            x = x + att @ self.w.wo[layer]
            h = _rmsnorm(x, self.w.ffn_norm[layer], cfg.norm_eps)
            y, top = self._moe(layer, h)
            experts[:, layer] = top
            x = x + y
        for c in caches:
            c.length += 1
        logits = _rmsnorm(x, self.w.final_norm, cfg.norm_eps) @ self.w.lm_head
        return logits.astype(_F32, copy=False), experts

    def new_cache(self, capacity: int = 64) -> KVCache:
        """An empty KV cache for this model."""
        return KVCache.empty(self.config, capacity)

    def prefill(self, token_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray, KVCache]:
        """Forward a whole sequence from scratch: per-position logits, routed experts and the cache."""
        cache = self.new_cache(max(64, len(token_ids) + 64))
        logits, experts = self.forward(token_ids, cache)
        return logits, experts, cache
