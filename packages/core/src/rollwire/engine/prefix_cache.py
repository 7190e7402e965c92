"""Prefix KV cache: reuse the keys/values of the longest already-computed token prefix.

Multi-turn rollouts resend the whole conversation every call; without reuse each turn re-prefills
everything before it (turns x T^2 attention work). Each finished sequence leaves its token ids, KV
and routed experts here; a new request starts from the longest common prefix with any entry.
Memory is bounded by a token budget (about 4 KiB of KV per token for the default model), evicting
least recently used entries first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .model import KVCache, TinyModel

__all__ = ["PrefixCache"]


@dataclass
class _Entry:
    ids: np.ndarray  # [n] int64
    k: np.ndarray  # [layers, heads, n, head_dim]
    v: np.ndarray
    experts: np.ndarray  # [n, layers, top_k] int32
    #: the weights its KV came from: 0 the base, else a LoRA adapter load's tag (and its name)
    tag: int = 0
    adapter: str | None = None


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.shape[0], b.shape[0])
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class PrefixCache:
    """LRU of finished sequences keyed by token ids; owned by the scheduler's worker thread."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next = 0
        self.tokens = 0
        #: Prompt tokens served from the cache so far (for tests and the benchmark).
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()
        self.tokens = 0

    def drop_tag(self, adapter: str) -> None:
        """Drop every entry computed with the LoRA adapter named ``adapter`` (unloaded)."""
        for key, e in list(self._entries.items()):
            if e.adapter == adapter:
                del self._entries[key]
                self.tokens -= e.ids.shape[0]

    def restore(
        self, model: TinyModel, ids: Sequence[int], limit: int, tag: int = 0
    ) -> tuple[KVCache, np.ndarray | None]:
        """A fresh cache holding the KV of the longest cached prefix of ``ids`` (at most ``limit``
        tokens) computed with the same weights (``tag``), and that prefix's routed experts (None
        when nothing matched)."""
        cache = model.new_cache(max(64, len(ids) + 64))
        if limit <= 0 or not self._entries:
            return cache, None
        query = np.asarray(ids, dtype=np.int64)
        best_key, best = -1, 0
        for key, e in self._entries.items():
            if e.tag != tag:
                continue
            m = _common_prefix(e.ids, query)
            if m > best:
                best_key, best = key, m
        best = min(best, limit)
        if best == 0:
            return cache, None
        e = self._entries[best_key]
        self._entries.move_to_end(best_key)
        cache.k[:, :, :best] = e.k[:, :, :best]
        cache.v[:, :, :best] = e.v[:, :, :best]
        cache.length = best
        self.hit_tokens += best
        return cache, e.experts[:best]

    def insert(
        self,
        ids: Sequence[int],
        cache: KVCache,
        experts: np.ndarray,
        tag: int = 0,
        adapter: str | None = None,
    ) -> None:
        """Remember the first ``cache.length`` tokens of ``ids`` (their KV and experts), computed
        with the weights ``tag`` (of the LoRA adapter ``adapter``; 0 and None: the base)."""
        n = cache.length
        if n == 0 or n > self.max_tokens or len(ids) < n or experts.shape[0] < n:
            return
        arr = np.asarray(ids[:n], dtype=np.int64)
        for key, e in list(self._entries.items()):
            if e.tag != tag:
                continue
            m = _common_prefix(e.ids, arr)
            if m == n:  # already covered by a longer (or equal) entry
                self._entries.move_to_end(key)
                return
            if m == e.ids.shape[0]:  # the new sequence extends this entry: replace it
                del self._entries[key]
                self.tokens -= m
        entry = _Entry(
            arr,
            cache.k[:, :, :n].copy(),
            cache.v[:, :, :n].copy(),
            np.ascontiguousarray(experts[:n], dtype=np.int32),
            tag,
            adapter,
        )
        self._entries[self._next] = entry
        self._next += 1
        self.tokens += n
        while self.tokens > self.max_tokens:
            _, old = self._entries.popitem(last=False)
            self.tokens -= old.ids.shape[0]
