"""Who wrote each token of a row: the policy, a tool, the user, the system prompt or the template.

Roles are one character per token so that a row's roles travel as one short string:

- ``P`` sampled by the policy and trained (loss mask 1)
- ``S`` sampled by the policy but not trained (an off-policy or non-trainable call)
- ``A`` assistant text in the context that this row did not sample (history re-rendered)
- ``T`` tool result, ``U`` user, ``Y`` system prompt
- ``M`` template: control tokens and the role headers they open
- ``C`` context whose role cannot be told (no tokenizer given)

Sampled tokens come from the row's masks and turn ids; the rest is read off the chat markup
(``<|im_start|>user\\n ... <|im_end|>`` and its kin), message by message, never token by token
in Python, so 10,000 rollouts stay quick.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from rollwire.data.protocol import Row

__all__ = ["ROLES", "ReportTokenizer", "Vocabulary", "row_roles"]

#: role code -> what it means, in the order the report's legend lists them
ROLES: dict[str, str] = {
    "P": "policy (trained)",
    "S": "sampled, not trained",
    "A": "assistant context",
    "T": "tool result",
    "U": "user",
    "Y": "system",
    "M": "template",
    "C": "context",
}

_HEADER_ROLES = {
    "user": "U",
    "human": "U",
    "system": "Y",
    "developer": "Y",
    "assistant": "A",
    "model": "A",
    "tool": "T",
    "ipython": "T",
    "function": "T",
}
_TOOL_RESPONSE = "<tool_response>"
_MARKER = re.compile(r"^<\|.*\|>$|^<｜.*｜>$|^\[/?INST\]$")


@runtime_checkable
class ReportTokenizer(Protocol):
    """What the report needs of a tokenizer (Hugging Face tokenizers and the engine's fit)."""

    @property
    def all_special_ids(self) -> Collection[int]:
        """Ids of special and added control tokens."""
        ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``token_ids``."""
        ...


class Vocabulary:
    """Token id -> text, decoded once per id and shared by every row of a report."""

    def __init__(self, tokenizer: ReportTokenizer | None) -> None:
        self.tokenizer = tokenizer
        self.pieces: dict[int, str] = {}
        self._special = set(tokenizer.all_special_ids) if tokenizer is not None else set()
        self._markers: set[int] = set(self._special)
        self._newline: set[int] = set()
        self._starts: set[int] = set()

    def learn(self, ids: np.ndarray) -> None:
        """Decode the ids not seen before."""
        if self.tokenizer is None:
            return
        for tid in np.unique(ids).tolist():
            if tid in self.pieces:
                continue
            piece = self._piece(tid)
            self.pieces[tid] = piece
            if "\n" in piece:
                self._newline.add(tid)
            if tid in self._special or _MARKER.match(piece.strip()):
                self._markers.add(tid)
                if "start" in piece or "header" in piece.lower() or piece.strip() == "[INST]":
                    self._starts.add(tid)

    def _piece(self, tid: int) -> str:
        tok = self.tokenizer
        text = getattr(tok, "token_text", None)
        if callable(text):
            try:
                return str(text(tid))
            except (IndexError, ValueError):
                return f"<{tid}>"
        assert tok is not None
        try:
            return tok.decode([tid], skip_special_tokens=False)
        except Exception:  # a tokenizer that cannot decode an out-of-vocabulary id
            return f"<{tid}>"

    def text(self, ids: Sequence[int] | np.ndarray) -> str:
        """Decoded text of ``ids`` (the ids themselves when there is no tokenizer)."""
        seq = [int(t) for t in ids]
        if self.tokenizer is None:
            return " ".join(str(t) for t in seq)
        return self.tokenizer.decode(seq, skip_special_tokens=False)

    def markers(self, ids: np.ndarray) -> np.ndarray:
        """Boolean mask of the control tokens of ``ids``."""
        return np.isin(ids, np.fromiter(self._markers, np.int64, len(self._markers)))

    def starts(self, ids: np.ndarray) -> np.ndarray:
        """Positions of the tokens that open a message (``<|im_start|>`` and kin)."""
        return np.flatnonzero(np.isin(ids, np.fromiter(self._starts, np.int64, len(self._starts))))

    def newlines(self, ids: np.ndarray) -> np.ndarray:
        """Boolean mask of the tokens whose text holds a newline."""
        return np.isin(ids, np.fromiter(self._newline, np.int64, len(self._newline)))


def row_roles(row: Row, vocab: Vocabulary) -> str:
    """One role code (see :data:`ROLES`) per token of ``row.input_ids``."""
    ids = row.input_ids
    n = ids.shape[0]
    codes = np.full(n, ord("C"), dtype=np.uint8)
    if vocab.tokenizer is not None:
        vocab.learn(ids)
        _markup_roles(ids, vocab, codes)
    sampled = np.zeros(n, dtype=bool)
    sampled[row.prompt_len :] = row.turn_ids >= 0
    trained = np.zeros(n, dtype=bool)
    trained[row.prompt_len :] = row.loss_mask > 0
    codes[sampled & ~trained] = ord("S")
    codes[trained] = ord("P")
    return codes.tobytes().decode("ascii")


def _markup_roles(ids: np.ndarray, vocab: Vocabulary, codes: np.ndarray) -> None:
    """Fill ``codes`` from the chat markup: each message's header, then its content's role."""
    n = ids.shape[0]
    markers = vocab.markers(ids)
    newlines = vocab.newlines(ids)
    starts = vocab.starts(ids)
    bounds = [*starts.tolist(), n]
    if bounds[0] > 0:
        codes[: bounds[0]] = ord("C")
    for at, end in itertools.pairwise(bounds):
        # The header runs from the start marker to the first newline (ChatML) or the next marker
        # (Llama 3's <|end_header_id|>), whichever comes first.
        after_nl = np.flatnonzero(newlines[at + 1 : end])
        after_mk = np.flatnonzero(markers[at + 1 : end])
        ends = [int(after_nl[0]) if after_nl.size else end - at - 1]
        if after_mk.size:
            ends.append(int(after_mk[0]))
        header_end = at + 1 + min(ends)
        header_end = min(header_end, end - 1)
        header = vocab.text(ids[at + 1 : header_end + 1]).strip().lower()
        word = re.split(r"[\s<|>]", header, maxsplit=1)[0] if header else ""
        role = _HEADER_ROLES.get(word, "C")
        body = slice(header_end + 1, end)
        if role == "U" and vocab.text(ids[body][:24]).lstrip().startswith(_TOOL_RESPONSE):
            role = "T"
        codes[at : header_end + 1] = ord("M")
        codes[body] = ord(role)
        # After the message's closing marker (e.g. the newline after <|im_end|>) is template.
        closing = np.flatnonzero(markers[header_end + 1 : end])
        if closing.size:
            codes[header_end + 1 + int(closing[0]) : end] = ord("M")
    codes[markers] = ord("M")
