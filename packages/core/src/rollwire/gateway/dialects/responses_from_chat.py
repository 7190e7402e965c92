"""The chat -> Responses direction of :mod:`.responses`: a Chat Completions request as an OpenAI
Responses request (the inverse of :func:`~.responses.request_to_chat` on what that function
produces). Pure functions, no I/O; re-exported from :mod:`.responses`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["SAME_KEYS", "request_from_chat"]

# Sampling keys that mean the same in both APIs.
SAME_KEYS = ("temperature", "top_p", "parallel_tool_calls", "user", "top_logprobs")


def _content_items(content: Any, role: str) -> Any:
    if isinstance(content, str) or content is None:
        return content or ""
    kind = "output_text" if role == "assistant" else "input_text"
    out = []
    for part in content:
        if part.get("type") == "image_url":
            image = part["image_url"]
            piece = {"type": "input_image", "image_url": image["url"]}
            piece["detail"] = image.get("detail", "auto")
            out.append(piece)
        else:
            out.append({"type": kind, "text": part.get("text", "")})
    return out


def _message_items(msg: Mapping[str, Any], n: int) -> list[dict[str, Any]]:
    role = msg.get("role")
    if role == "tool":
        output = _content_items(msg.get("content"), "user")
        return [
            {"type": "function_call_output", "call_id": msg.get("tool_call_id"), "output": output}
        ]
    if role != "assistant":
        return [
            {"type": "message", "role": role, "content": _content_items(msg.get("content"), "user")}
        ]
    items: list[dict[str, Any]] = []
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning:
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{n}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
            }
        )
    if msg.get("content"):
        items.append({"type": "message", "role": "assistant", "content": msg["content"]})
    for call in msg.get("tool_calls") or ():
        fn = call["function"]
        items.append(
            {
                "type": "function_call",
                "call_id": call["id"],
                "name": fn["name"],
                "arguments": fn["arguments"],
            }
        )
    return items


def request_from_chat(chat: Mapping[str, Any]) -> dict[str, Any]:
    """A Chat Completions request as a Responses request (the inverse of :func:`request_to_chat`
    on what that function produces)."""
    messages = list(chat.get("messages") or [])
    body: dict[str, Any] = {"model": chat.get("model") or "policy"}
    if messages and messages[0].get("role") == "system" and isinstance(messages[0]["content"], str):
        body["instructions"] = messages.pop(0)["content"]
    body["input"] = [item for n, m in enumerate(messages) for item in _message_items(m, n)]
    if chat.get("tools"):
        body["tools"] = [{"type": "function", **t["function"]} for t in chat["tools"]]
    choice = chat.get("tool_choice")
    if isinstance(choice, dict):
        body["tool_choice"] = {"type": "function", "name": choice["function"]["name"]}
    elif choice is not None:
        body["tool_choice"] = choice
    if chat.get("max_tokens") is not None:
        body["max_output_tokens"] = chat["max_tokens"]
    for key in SAME_KEYS:
        if chat.get(key) is not None:
            body[key] = chat[key]
    fmt = chat.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        body["text"] = {"format": {"type": "json_schema", **fmt["json_schema"]}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        body["text"] = {"format": {"type": "json_object"}}
    if chat.get("reasoning_effort") is not None:
        body["reasoning"] = {"effort": chat["reasoning_effort"]}
    return body
