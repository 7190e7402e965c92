"""OpenAI ``chat.completion`` bodies and SSE streams for ``capture="tokens"``, built after generation."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import numpy as np
import orjson

from rollwire.gateway.tokens.parsers import ParsedCompletion

__all__ = ["chat_completion", "sse_chunks"]

_CONTENT_CHUNK = 64  # characters per content delta when streaming a finished completion


def _entry(token_text: Callable[[int], str], token_id: int, logprob: float) -> dict[str, Any]:
    text = token_text(int(token_id))
    return {"token": text, "logprob": float(logprob), "bytes": list(text.encode())}


def _logprobs_content(
    ids: np.ndarray,
    logprobs: np.ndarray,
    token_text: Callable[[int], str],
    top_logprobs: Sequence[Sequence[tuple[int, float]]] | None = None,
    top_n: int = 0,
) -> list[dict[str, Any]]:
    """OpenAI ``logprobs.content``: each sampled token and the backend's ``top_n`` alternatives."""
    out = []
    tops = top_logprobs if top_logprobs is not None and top_n > 0 else None
    for j, (t, lp) in enumerate(zip(ids.tolist(), logprobs.tolist(), strict=True)):
        entry = _entry(token_text, t, lp)
        alternatives = tops[j][:top_n] if tops is not None and j < len(tops) else ()
        entry["top_logprobs"] = [_entry(token_text, tt, tlp) for tt, tlp in alternatives]
        out.append(entry)
    return out


def chat_completion(
    *,
    model: str,
    parsed: ParsedCompletion,
    finish_reason: str,
    prompt_ids: np.ndarray,
    completion_ids: np.ndarray,
    logprobs: np.ndarray,
    token_text: Callable[[int], str],
    want_logprobs: bool,
    want_token_ids: bool,
    top_logprobs: Sequence[Sequence[tuple[int, float]]] | None = None,
    top_n: int = 0,
) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` body (vendor fields only when the agent asked);
    ``top_n`` alternatives per token from the backend's ``top_logprobs``."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": parsed.message(),
        "finish_reason": finish_reason,
        "logprobs": {
            "content": _logprobs_content(completion_ids, logprobs, token_text, top_logprobs, top_n)
        }
        if want_logprobs
        else None,
    }
    body: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": int(prompt_ids.shape[0]),
            "completion_tokens": int(completion_ids.shape[0]),
            "total_tokens": int(prompt_ids.shape[0] + completion_ids.shape[0]),
        },
    }
    if want_token_ids:
        body["prompt_token_ids"] = prompt_ids.tolist()
        choice["token_ids"] = completion_ids.tolist()
    return body


def _pieces(text: str) -> Sequence[str]:
    return [text[i : i + _CONTENT_CHUNK] for i in range(0, len(text), _CONTENT_CHUNK)]


def sse_chunks(completion: dict[str, Any], include_usage: bool) -> list[bytes]:
    """A finished ``chat.completion`` as ``chat.completion.chunk`` SSE events, ending ``[DONE]``.

    Order: role delta, reasoning deltas, content deltas, one tool-call delta per index (id, type,
    name and the whole arguments), the finish chunk, the usage chunk when asked, ``[DONE]``.
    """
    head = {
        "id": completion["id"],
        "object": "chat.completion.chunk",
        "created": completion["created"],
        "model": completion["model"],
    }
    choice = completion["choices"][0]
    msg = choice["message"]
    events: list[dict[str, Any]] = []

    def delta(d: dict[str, Any], **extra: Any) -> None:
        events.append(
            {
                **head,
                "choices": [
                    {"index": 0, "delta": d, "logprobs": None, "finish_reason": None, **extra}
                ],
            }
        )

    first: dict[str, Any] = {"role": "assistant", "content": ""}
    if "prompt_token_ids" in completion:
        events.append(
            {
                **head,
                "prompt_token_ids": completion["prompt_token_ids"],
                "choices": [{"index": 0, "delta": first, "logprobs": None, "finish_reason": None}],
            }
        )
    else:
        delta(first)
    if msg.get("reasoning"):
        for piece in _pieces(msg["reasoning"]):
            delta({"reasoning": piece, "reasoning_content": piece})
    if msg.get("content"):
        for piece in _pieces(msg["content"]):
            delta({"content": piece})
    for i, call in enumerate(msg.get("tool_calls") or ()):
        delta(
            {
                "tool_calls": [
                    {
                        "index": i,
                        "id": call["id"],
                        "type": "function",
                        "function": {
                            "name": call["function"]["name"],
                            "arguments": call["function"]["arguments"],
                        },
                    }
                ]
            }
        )
    final: dict[str, Any] = {
        "index": 0,
        "delta": {},
        "logprobs": choice.get("logprobs"),
        "finish_reason": choice["finish_reason"],
    }
    if "token_ids" in choice:
        final["token_ids"] = choice["token_ids"]
    events.append({**head, "choices": [final]})
    if include_usage:
        events.append({**head, "choices": [], "usage": completion["usage"]})
    out = [b"data: " + orjson.dumps(e) + b"\n\n" for e in events]
    out.append(b"data: [DONE]\n\n")
    return out


async def iterate(chunks: list[bytes]) -> AsyncIterator[bytes]:
    """Yield prepared SSE chunks (for a Starlette ``StreamingResponse``)."""
    for chunk in chunks:
        yield chunk
