"""The Responses API's answer side: a ``chat.completion`` body as a ``response`` object (reasoning,
message and ``function_call`` output items, usage, status), and back. Pure functions, no I/O."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ENCRYPTED_REASONING",
    "INCOMPLETE_REASONS",
    "SEALED_PREFIX",
    "output_items",
    "response_from_chat",
]

ENCRYPTED_REASONING = "reasoning.encrypted_content"
SEALED_PREFIX = "rollwire:"  # prefix of the (not encrypted, only encoded) reasoning we hand out


# --------------------------------------------------------------------------------- responses
def _seal(text: str) -> str:
    return SEALED_PREFIX + base64.b64encode(text.encode("utf-8")).decode("ascii")


def output_items(
    message: Mapping[str, Any], response_id: str, *, status: str, sealed: bool
) -> list[dict[str, Any]]:
    """The output items of one assistant message: reasoning, then text, then function calls."""
    suffix = response_id.removeprefix("resp_")
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        item: dict[str, Any] = {
            "id": f"rs_{suffix}",
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": reasoning}],
            "status": status,
        }
        if sealed:
            item["encrypted_content"] = _seal(reasoning)
        items.append(item)
    content = message.get("content")
    if content:
        text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
        items.append(
            {
                "id": f"msg_{suffix}",
                "type": "message",
                "status": status,
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
                ],
            }
        )
    for i, call in enumerate(message.get("tool_calls") or ()):
        fn = call.get("function") or {}
        items.append(
            {
                "id": f"fc_{suffix}_{i}",
                "type": "function_call",
                "status": "completed",
                "call_id": call.get("id") or f"call_{suffix}_{i}",
                "name": fn.get("name", ""),
                "arguments": fn.get("arguments", ""),
            }
        )
    return items


INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


def response_from_chat(
    completion: Mapping[str, Any],
    request: Mapping[str, Any],
    *,
    response_id: str,
    created_at: float,
) -> dict[str, Any]:
    """A ``chat.completion`` body as the ``response`` object answering ``request``."""
    choice = (completion.get("choices") or [{}])[0]
    finish = choice.get("finish_reason")
    incomplete = INCOMPLETE_REASONS.get(finish or "")
    status = "incomplete" if incomplete else "completed"
    include = request.get("include")
    sealed = isinstance(include, list) and ENCRYPTED_REASONING in include
    usage = completion.get("usage") or {}
    prompt, generated = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    asked = request.get("reasoning")
    reasoning: Mapping[str, Any] = asked if isinstance(asked, dict) else {}
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(created_at),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "max_tool_calls": None,
        "model": request.get("model") or completion.get("model") or "policy",
        "output": output_items(
            choice.get("message") or {}, response_id, status=status, sealed=sealed
        ),
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": request.get("previous_response_id"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "service_tier": "default",
        "store": request.get("store", True),
        "temperature": request.get("temperature", 1.0),
        "text": request.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": list(request.get("tools") or []),
        "top_logprobs": request.get("top_logprobs", 0),
        "top_p": request.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": generated,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + generated,
        },
        "user": request.get("user"),
        "metadata": dict(meta) if isinstance(meta := request.get("metadata"), Mapping) else {},
    }
