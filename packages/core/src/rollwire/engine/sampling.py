"""Sampling parameters, token choice and log-prob math of the embedded engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

__all__ = [
    "SamplingParams",
    "choose_token",
    "log_softmax",
    "token_logprobs",
    "token_rank",
    "top_logprobs",
]

LogprobsMode = Literal["raw", "processed"]


@dataclass
class SamplingParams:
    """Per-request sampling settings (the union of what vLLM and SGLang accept)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    #: Top log-probs per output token (0: only the chosen token's); None: no top list.
    logprobs: int | None = None
    #: Top log-probs per prompt token; None: no prompt log-probs.
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        """Temperature 0 means argmax, as in vLLM."""
        return self.temperature < 1e-5


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-softmax over the last axis in float64 (one function for prefill and decode, so they agree)."""
    x = logits.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return np.asarray(x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def token_logprobs(logits: np.ndarray, mode: LogprobsMode, temperature: float) -> np.ndarray:
    """Log-probs reported to callers: ``raw`` (vLLM: before any processing) or ``processed``
    (SGLang: after temperature scaling; greedy counts as temperature 1)."""
    if mode == "processed" and temperature >= 1e-5:
        return log_softmax(logits.astype(np.float64) / temperature)
    return log_softmax(logits)


def choose_token(logits: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> int:
    """Pick the next token from one row of logits with temperature, top-k, min-p and top-p."""
    if p.greedy:
        return int(np.argmax(logits))
    x = logits.astype(np.float64) / p.temperature
    vocab = x.shape[0]
    if 0 < p.top_k < vocab:
        kth = np.partition(x, vocab - p.top_k)[vocab - p.top_k]
        x = np.where(x < kth, -np.inf, x)
    probs = np.exp(x - x.max())
    probs /= probs.sum()
    if p.min_p > 0:
        probs = np.where(probs < p.min_p * probs.max(), 0.0, probs)
        probs /= probs.sum()
    if p.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cum = np.cumsum(probs[order])
        keep = int(np.searchsorted(cum, p.top_p)) + 1
        mask = np.zeros_like(probs)
        mask[order[:keep]] = 1.0
        probs = probs * mask
        probs /= probs.sum()
    cdf = np.cumsum(probs)
    idx = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(idx, vocab - 1)


def top_logprobs(lp: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The ``k`` most likely ``(token_id, logprob)`` pairs of one row, best first."""
    if k <= 0:
        return []
    k = min(k, lp.shape[0])
    idx = np.argpartition(-lp, k - 1)[:k]
    idx = idx[np.argsort(-lp[idx], kind="stable")]
    return [(int(i), float(lp[i])) for i in idx]


def token_rank(lp: np.ndarray, tid: int) -> int:
    """1-based rank of ``tid`` in one row of log-probs (ties share the better rank)."""
    return int(np.count_nonzero(lp > lp[tid])) + 1
