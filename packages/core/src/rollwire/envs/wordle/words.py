"""The shipped word list (a few hundred common five-letter words) and its train/validation split."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import resources
from typing import Literal

__all__ = ["all_words", "split_words"]

Split = Literal["train", "validation"]
#: About one word in five goes to validation.
VALIDATION_FRACTION = 0.2


@lru_cache(maxsize=1)
def all_words() -> tuple[str, ...]:
    """Every word, lower case, sorted, unique."""
    text = resources.files("rollwire.envs.wordle").joinpath("words.txt").read_text("utf-8")
    return tuple(sorted({w.strip().lower() for w in text.split() if w.strip()}))


def _bucket(word: str) -> float:
    # A hash, not a shuffle: a word's split never changes when words are added to the list.
    digest = hashlib.sha256(f"rollwire-wordle:{word}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@lru_cache(maxsize=2)
def split_words(split: Split) -> tuple[str, ...]:
    """The ``train`` or ``validation`` words; the two never overlap."""
    if split not in ("train", "validation"):
        raise ValueError(f"split must be 'train' or 'validation', got {split!r}")
    val = split == "validation"
    return tuple(w for w in all_words() if (_bucket(w) < VALIDATION_FRACTION) == val)
