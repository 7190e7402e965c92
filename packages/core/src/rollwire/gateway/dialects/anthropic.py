"""Anthropic Messages (``POST /v1/messages``) as Chat Completions, and back.

Pure functions, no I/O:

- :func:`request_to_chat` / :func:`request_from_chat`: ``system``, ``messages`` with ``text``,
  ``image``, ``tool_use``, ``tool_result`` and ``thinking`` blocks, ``tools``, ``tool_choice``,
  ``stop_sequences``, ``max_tokens`` as a Chat Completions request. A user turn's ``tool_result``
  blocks become ``tool`` messages (in order, before the turn's other content), an assistant turn's
  ``thinking`` its ``reasoning_content`` and its ``tool_use`` blocks its ``tool_calls``.
- :func:`message_from_chat` / :func:`message_to_chat`: a ``chat.completion`` body as a ``message``
  (``thinking``, ``text``, ``tool_use`` blocks; ``stop_reason``; usage).

The chat → Messages direction (:func:`request_from_chat`, :func:`message_from_chat`) lives in
:mod:`.anthropic_from_chat` and is re-exported here. Thinking blocks carry the signature
:data:`SIGNATURE` (the gateway checks none). Server tools (web search, code execution, ...) and
documents are refused with a :class:`DialectError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from rollwire.gateway.dialects.anthropic_from_chat import (
    SIGNATURE,
    STOP_REASONS,
    message_from_chat,
    request_from_chat,
)
from rollwire.gateway.dialects.errors import DialectError

__all__ = [
    "SIGNATURE",
    "count_request",
    "message_from_chat",
    "message_to_chat",
    "request_from_chat",
    "request_to_chat",
]

_IGNORED = frozenset(
    {
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "stop_sequences",
        "max_tokens",
        "stream",
        "metadata",
        "temperature",
        "top_p",
        "top_k",
        "thinking",
        "service_tier",
        "context_management",
        "cache_control",
        "output_config",
    }
)
_REFUSED = {
    "mcp_servers": "MCP servers run at Anthropic; the gateway serves custom tools only",
    "container": "containers (code execution) run at Anthropic",
}


def _text(block: Mapping[str, Any]) -> str:
    return str(block.get("text", ""))


def _image(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise DialectError(f"{where}.source must be an object", param=f"{where}.source")
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    elif source.get("type") == "url":
        url = str(source.get("url"))
    else:
        raise DialectError(
            f"{where}.source type {source.get('type')!r} is not supported (base64 or url)",
            param=f"{where}.source",
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise DialectError(f"{where} must be a string or a list of content blocks", param=where)
    return [dict(b) for b in content]


def _chat_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _tool_result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    parts = []
    for i, inner in enumerate(_blocks(block.get("content", ""), f"{where}.content")):
        if inner.get("type") == "text":
            parts.append({"type": "text", "text": _text(inner)})
        elif inner.get("type") == "image":
            parts.append(_image(inner, f"{where}.content[{i}]"))
        else:
            raise DialectError(
                f"{where}.content[{i}] is of type {inner.get('type')!r}; tool results may hold "
                "text and image blocks",
                param=f"{where}.content[{i}].type",
            )
    return {
        "role": "tool",
        "tool_call_id": str(block.get("tool_use_id", "")),
        "content": _chat_content(parts),
    }


def _user(content: Any, where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(_blocks(content, where)):
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": _text(block)})
        elif kind == "image":
            parts.append(_image(block, f"{where}[{i}]"))
        elif kind == "tool_result":
            out.append(_tool_result(block, f"{where}[{i}]"))
        else:
            raise DialectError(
                f"{where}[{i}] is a {kind!r} block; user turns may hold text, image and "
                "tool_result blocks",
                param=f"{where}[{i}].type",
            )
    if parts or not out:
        out.append({"role": "user", "content": _chat_content(parts)})
    return out


def _assistant(content: Any, where: str) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": None}
    texts: list[str] = []
    for i, block in enumerate(_blocks(content, where)):
        kind = block.get("type")
        if kind == "text":
            texts.append(_text(block))
        elif kind == "thinking":
            msg["reasoning_content"] = (msg.get("reasoning_content") or "") + str(
                block.get("thinking", "")
            )
        elif kind == "redacted_thinking":
            continue  # opaque to anyone but Anthropic; the model never saw it as text
        elif kind == "tool_use":
            msg.setdefault("tool_calls", []).append(
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {
                        "name": str(block.get("name", "")),
                        "arguments": orjson.dumps(block.get("input") or {}).decode(),
                    },
                }
            )
        else:
            raise DialectError(
                f"{where}[{i}] is a {kind!r} block; assistant turns may hold text, thinking "
                "and tool_use blocks",
                param=f"{where}[{i}].type",
            )
    if texts:
        msg["content"] = "".join(texts)
    return msg


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise DialectError("'tools' must be a list", param="tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") not in (None, "custom"):
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise DialectError(
                f"tools[{i}] is a server tool of type {kind!r}; the gateway serves custom tools "
                "(name, description, input_schema) only",
                param=f"tools[{i}].type",
            )
        if not tool.get("name"):
            raise DialectError(f"tools[{i}] has no name", param=f"tools[{i}].name")
        fn: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description"):
            fn["description"] = tool["description"]
        fn["parameters"] = tool.get("input_schema") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise DialectError(
            f"tool_choice {choice!r} is not supported; use type auto, any, tool or none",
            param="tool_choice",
        )
    kind = choice["type"]
    if kind == "tool":
        if not choice.get("name"):
            raise DialectError("tool_choice of type 'tool' needs a name", param="tool_choice")
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def _system(system: Any) -> str:
    if isinstance(system, str):
        return system
    blocks = _blocks(system, "system")
    for i, block in enumerate(blocks):
        if block.get("type") != "text":
            raise DialectError(
                f"system[{i}] is a {block.get('type')!r} block; system takes text blocks",
                param=f"system[{i}].type",
            )
    return "\n\n".join(_text(b) for b in blocks)


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _system(system)})
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise DialectError("'messages' must be a non-empty list", param="messages")
    for i, msg in enumerate(raw):
        role = msg.get("role") if isinstance(msg, dict) else None
        content = msg.get("content", "") if role is not None else None
        if isinstance(content, str) and role in ("user", "assistant"):
            # Plain text (most turns): what the block path below makes of a single text block.
            messages.append({"role": role, "content": content})
            continue
        where = f"messages[{i}].content"
        if role == "user":
            messages.extend(_user(content, where))
        elif role == "assistant":
            messages.append(_assistant(content, where))
        elif role == "system":  # mid-conversation system text (Claude Code sends it)
            messages.append({"role": "system", "content": _system(msg.get("content", ""))})
        else:
            raise DialectError(
                f"messages[{i}].role is {role!r}; expected user, assistant or system",
                param=f"messages[{i}].role",
            )
    return messages


def request_to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request as a Chat Completions request (without ``stream``)."""
    for key, why in _REFUSED.items():
        if body.get(key):
            raise DialectError(f"'{key}': {why}", param=key)
    if not isinstance(body.get("max_tokens"), int) or isinstance(body.get("max_tokens"), bool):
        raise DialectError("'max_tokens' (an integer) is required", param="max_tokens")
    chat: dict[str, Any] = {
        "model": body.get("model") or "policy",
        "messages": _messages(body),
        "max_tokens": body["max_tokens"],
    }
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], chat)
    stops = body.get("stop_sequences")
    if stops:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise DialectError("'stop_sequences' must be a list of strings", param="stop_sequences")
        chat["stop"] = list(stops)
    for key in ("temperature", "top_p", "top_k"):
        if body.get(key) is not None:
            chat[key] = body[key]
    # Anything else (a backend's sampling extensions: min_p, ...) goes on as it came.
    chat.update((k, v) for k, v in body.items() if k not in _IGNORED and k not in _REFUSED)
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in (
        "enabled",
        "disabled",
        "adaptive",
    ):
        chat["chat_template_kwargs"] = {"enable_thinking": thinking["type"] != "disabled"}
    return chat


def count_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat messages and tools a ``/v1/messages/count_tokens`` request counts."""
    chat: dict[str, Any] = {"model": body.get("model") or "policy", "messages": _messages(body)}
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    return chat


def message_to_chat(message: Mapping[str, Any]) -> dict[str, Any]:
    """A Messages ``message`` as the ``chat.completion`` it was made from (the inverse of
    :func:`message_from_chat` on the fields both carry)."""
    msg = _assistant(message.get("content") or [], "content")
    if msg.get("reasoning_content") is not None:
        msg["reasoning"] = msg["reasoning_content"]
    finish = {v: k for k, v in STOP_REASONS.items()}.get(message.get("stop_reason") or "", "stop")
    choice: dict[str, Any] = {"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}
    if message.get("stop_sequence") is not None:
        choice["stop_reason"] = message["stop_sequence"]
    usage = message.get("usage") or {}
    n_in, n_out = int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))
    return {
        "id": message.get("id"),
        "object": "chat.completion",
        "model": message.get("model"),
        "choices": [choice],
        "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out},
    }
