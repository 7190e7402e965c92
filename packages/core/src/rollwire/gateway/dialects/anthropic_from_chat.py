"""Chat Completions as Anthropic Messages: a chat request as a Messages request, a
``chat.completion`` body as the ``message`` answering one. Pure functions, no I/O; the other
direction is :mod:`rollwire.gateway.dialects.anthropic`, which re-exports these."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

__all__ = [
    "SIGNATURE",
    "STOP_REASONS",
    "assistant_blocks",
    "message_from_chat",
    "request_from_chat",
]

#: the signature of the thinking blocks the gateway writes (it checks none)
SIGNATURE = "rollwire"
#: Chat Completions' finish reasons as Messages' stop reasons
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _blocks_from_content(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str) or content is None:
        return [{"type": "text", "text": content}] if content else []
    out = []
    for part in content:
        if part.get("type") == "image_url":
            url = part["image_url"]["url"]
            if url.startswith("data:"):
                media, _, data = url[5:].partition(";base64,")
                source = {"type": "base64", "media_type": media, "data": data}
            else:
                source = {"type": "url", "url": url}
            out.append({"type": "image", "source": source})
        else:
            out.append({"type": "text", "text": part.get("text", "")})
    return out


def assistant_blocks(msg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An assistant chat message as Messages content blocks (thinking, text, tool_use)."""
    blocks: list[dict[str, Any]] = []
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": SIGNATURE})
    blocks += _blocks_from_content(msg.get("content"))
    for call in msg.get("tool_calls") or ():
        fn = call.get("function") or {}
        try:
            args = orjson.loads(fn.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            args = None
        if not isinstance(args, dict):
            # Not a JSON object: Messages carries tool input as an object, so keep the text.
            args = {"_raw_arguments": fn.get("arguments")}
        blocks.append(
            {"type": "tool_use", "id": call.get("id"), "name": fn.get("name"), "input": args}
        )
    return blocks


def request_from_chat(chat: Mapping[str, Any]) -> dict[str, Any]:
    """A Chat Completions request as a Messages request (the inverse of
    :func:`rollwire.gateway.dialects.anthropic.request_to_chat` on what that function produces)."""
    messages = list(chat.get("messages") or ())
    body: dict[str, Any] = {
        "model": chat.get("model") or "policy",
        "max_tokens": chat.get("max_tokens"),
    }
    if messages and messages[0].get("role") == "system":
        body["system"] = messages.pop(0)["content"]
    turns: list[dict[str, Any]] = []
    for msg in messages:
        if msg["role"] == "system":
            turns.append({"role": "system", "content": msg["content"]})
            continue
        if msg["role"] == "assistant":
            turns.append({"role": "assistant", "content": assistant_blocks(msg)})
            continue
        if msg["role"] == "tool":
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": msg["tool_call_id"],
                "content": _blocks_from_content(msg.get("content")),
            }
            blocks = [block]
        else:
            blocks = _blocks_from_content(msg.get("content")) or [{"type": "text", "text": ""}]
        if (
            turns
            and turns[-1]["role"] == "user"
            and (msg["role"] == "tool" or turns[-1]["content"][-1]["type"] == "tool_result")
        ):
            turns[-1]["content"] += blocks  # tool results and what follows share one user turn
        else:
            turns.append({"role": "user", "content": blocks})
    body["messages"] = turns
    if chat.get("tools"):
        body["tools"] = [
            {
                "name": t["function"]["name"],
                **(
                    {"description": t["function"]["description"]}
                    if "description" in t["function"]
                    else {}
                ),
                "input_schema": t["function"].get("parameters"),
            }
            for t in chat["tools"]
        ]
    choice = chat.get("tool_choice")
    if choice is not None:
        if isinstance(choice, dict):
            tc: dict[str, Any] = {"type": "tool", "name": choice["function"]["name"]}
        else:
            tc = {"type": {"auto": "auto", "required": "any", "none": "none"}[choice]}
        if chat.get("parallel_tool_calls") is False:
            tc["disable_parallel_tool_use"] = True
        body["tool_choice"] = tc
    if chat.get("stop"):
        body["stop_sequences"] = list(chat["stop"])
    for key in ("temperature", "top_p", "top_k"):
        if chat.get(key) is not None:
            body[key] = chat[key]
    kwargs = chat.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and "enable_thinking" in kwargs:
        body["thinking"] = {"type": "enabled" if kwargs["enable_thinking"] else "disabled"}
        if kwargs["enable_thinking"]:
            body["thinking"]["budget_tokens"] = chat.get("max_tokens")
    return body


def _stop(choice: Mapping[str, Any], request: Mapping[str, Any]) -> tuple[str, str | None]:
    matched = choice.get("stop_reason")
    stops = request.get("stop_sequences") or ()
    if choice.get("finish_reason") == "stop" and isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return STOP_REASONS.get(choice.get("finish_reason") or "stop", "end_turn"), None


def message_from_chat(
    completion: Mapping[str, Any], request: Mapping[str, Any], *, message_id: str
) -> dict[str, Any]:
    """A ``chat.completion`` body as the Messages ``message`` answering ``request``."""
    choice = (completion.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    stop_reason, stop_sequence = _stop(choice, request)
    if stop_reason == "end_turn" and msg.get("tool_calls"):
        stop_reason = "tool_use"
    usage = completion.get("usage") or {}
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": request.get("model") or completion.get("model") or "policy",
        "content": assistant_blocks(msg),
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {
            "input_tokens": int(usage.get("prompt_tokens", 0)),
            "output_tokens": int(usage.get("completion_tokens", 0)),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
