"""Reading a backend's non-streamed answer, with the prompt's token ids parsed only past what the
session's previous answer already had.

In a multi-turn rollout each call's prompt is the previous call's prompt, its completion and the
new turns, and vLLM (SGLang too) sends it back whole in ``prompt_token_ids``: at an 8k-token
context ~45 kB of JSON a call, most of the answer, and parsing it into Python ints and packing
them was the largest single cost of a call's capture. So the gateway keeps, per session, the
length and XXH3-128 digest of the last ``prompt_token_ids`` text and its ids (a
:class:`PromptMemo`; :class:`PromptMemos` keeps them, 4M ids in all, and
:func:`read_session_answer` reads with them). The next answer's prompt text is cut out of the
body before the rest is parsed; where it starts with the remembered text (same length, same
digest) and goes on with a comma, only the ids after it are parsed, and the remembered ids are
reused (the same array when nothing was added). Anything else (no memo, another prefix, odd
layout) parses the ids whole; a body the cut cannot place exactly is parsed as it came. The
result is the plain parse's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import xxhash

from rollwire.gateway.dataplane.capture import int32_ids

__all__ = ["MEMOS", "PromptMemo", "PromptMemos", "read_answer", "read_session_answer"]

_KEY = b'"prompt_token_ids":['
#: stands in for the cut-out ids while the rest is parsed: below int32, so no backend's token id
_MARK = -2147483649
_MARK_LIST = [_MARK]
_MARK_JSON = b"-2147483649"


@dataclass(slots=True)
class PromptMemo:
    """A session's last ``prompt_token_ids``: its JSON text's length and XXH3-128, and its ids."""

    size: int
    digest: bytes
    ids: np.ndarray


class PromptMemos:
    """The sessions' memos, ``max_ids`` ids in all at most (the longest unchanged go first). A
    memo is only ever used where its digest matches the text, so a stale or evicted one costs a
    full parse, never a wrong capture."""

    def __init__(self, max_ids: int = 4_000_000) -> None:
        self.max_ids = max_ids
        self.ids = 0
        self._memos: OrderedDict[str, PromptMemo] = OrderedDict()
        self._lock = threading.Lock()  # gateways in threads of one process share MEMOS

    def __len__(self) -> int:
        return len(self._memos)

    def get(self, session_id: str) -> PromptMemo | None:
        return self._memos.get(session_id)

    def put(self, session_id: str, memo: PromptMemo) -> None:
        memos = self._memos
        with self._lock:
            old = memos.pop(session_id, None)
            if old is not None:
                self.ids -= old.ids.shape[0]
            memos[session_id] = memo
            self.ids += memo.ids.shape[0]
            while self.ids > self.max_ids and memos:
                self.ids -= memos.popitem(last=False)[1].ids.shape[0]

    def drop(self, session_id: str) -> None:
        """Forget a session's memo (it ended: no answer of it will come again)."""
        with self._lock:
            old = self._memos.pop(session_id, None)
            if old is not None:
                self.ids -= old.ids.shape[0]


#: this process's memos (digest-checked, so gateways in one process may share them)
MEMOS = PromptMemos()


def read_session_answer(
    payload: bytes, session_id: str, memos: PromptMemos = MEMOS
) -> tuple[dict[str, Any], np.ndarray | None]:
    """:func:`read_answer` with ``session_id``'s memo, which it then keeps."""
    memo = memos.get(session_id)
    data, ids, new_memo = read_answer(payload, memo)
    if new_memo is not None and new_memo is not memo:
        memos.put(session_id, new_memo)
    return data, ids


def read_answer(
    payload: bytes, memo: PromptMemo | None
) -> tuple[dict[str, Any], np.ndarray | None, PromptMemo | None]:
    """``(data, prompt_ids, new_memo)`` for a non-streamed answer.

    When ``prompt_ids`` is not None it is the answer's ``prompt_token_ids`` (at the top level or
    in its first choice), and that key has been taken out of ``data``; otherwise ``data`` is the
    plain parse and ``new_memo`` is ``memo``. Raises :class:`orjson.JSONDecodeError` for a body
    that is not JSON, as the plain parse does.
    """
    key_at = payload.rfind(_KEY)
    if key_at <= 0 or payload[key_at - 1] == 0x5C:  # absent, or an escaped quote (a string's)
        return orjson.loads(payload), None, memo
    start = key_at + len(_KEY)
    end = payload.find(b"]", start)
    if end < 0:
        return orjson.loads(payload), None, memo
    span = payload[start:end]
    try:
        ids, new_memo = _prompt_ids(span, memo)
    except (orjson.JSONDecodeError, TypeError, ValueError, OverflowError):
        return orjson.loads(payload), None, memo
    data = orjson.loads(b"".join((payload[:start], _MARK_JSON, payload[end:])))
    if type(data) is dict:
        if data.get("prompt_token_ids") == _MARK_LIST:
            del data["prompt_token_ids"]
            return data, ids, new_memo
        choices = data.get("choices")
        first = choices[0] if type(choices) is list and choices else None
        # The capture reads the top level first: the choice's only count where that has none.
        if (
            type(first) is dict
            and data.get("prompt_token_ids") is None
            and first.get("prompt_token_ids") == _MARK_LIST
        ):
            del first["prompt_token_ids"]
            return data, ids, new_memo
    # The cut landed somewhere the capture does not read from: parse the body as it came.
    return orjson.loads(payload), None, memo


def _prompt_ids(span: bytes, memo: PromptMemo | None) -> tuple[np.ndarray, PromptMemo]:
    """The ids of the JSON array text ``[span]``, reusing ``memo``'s where ``span`` extends it."""
    h = xxhash.xxh3_128()
    if memo is not None and len(span) >= memo.size:
        view = memoryview(span)
        h.update(view[: memo.size])
        if h.digest() == memo.digest:
            if len(span) == memo.size:
                return memo.ids, memo
            if span[memo.size] == 0x2C:  # a comma: the remembered ids, then more
                more = int32_ids(orjson.loads(b"[" + span[memo.size + 1 :] + b"]"))
                h.update(view[memo.size :])
                ids = np.concatenate((memo.ids, more)) if memo.ids.shape[0] else more
                return ids, PromptMemo(len(span), h.digest(), ids)
        h.reset()
    ids = int32_ids(orjson.loads(b"[" + span + b"]"))
    h.update(span)
    return ids, PromptMemo(len(span), h.digest(), ids)
