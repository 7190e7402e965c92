"""The OpenAI Responses API (``POST /v1/responses``) as Chat Completions, and back.

Pure functions, no I/O:

- :func:`request_to_chat` / :func:`request_from_chat`: a Responses request (``input`` string or
  items, ``instructions``, function ``tools``, ``tool_choice``, ...) as a Chat Completions request;
  the history a ``previous_response_id`` names is passed in as chat messages (the gateway resolves
  it within the session).
- :func:`response_from_chat` / :func:`response_to_chat`: a ``chat.completion`` body as a
  ``response`` object (reasoning, message and ``function_call`` output items, usage, status).

Reasoning goes out as a ``reasoning`` item with ``reasoning_text`` content; when the client asks
for ``include: ["reasoning.encrypted_content"]`` (stateless clients such as Codex CLI send
``store: false`` and replay reasoning items) it is also put, reversibly, in ``encrypted_content``.
Anything that cannot be served faithfully is refused with a :class:`DialectError` naming the field.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from rollwire.gateway.dialects.errors import DialectError
from rollwire.gateway.dialects.responses_from_chat import SAME_KEYS, request_from_chat
from rollwire.gateway.dialects.responses_output import (
    ENCRYPTED_REASONING,
    INCOMPLETE_REASONS,
    SEALED_PREFIX,
    output_items,
    response_from_chat,
)

__all__ = [
    "ENCRYPTED_REASONING",
    "history_after",
    "output_items",
    "request_from_chat",
    "request_to_chat",
    "response_from_chat",
    "response_to_chat",
]

# Accepted and not forwarded: bookkeeping the backend has no use for.
_IGNORED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "stream",
        "store",
        "include",
        "metadata",
        "previous_response_id",
        "max_output_tokens",
        "text",
        "reasoning",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "context_management",
        "safety_identifier",
        "service_tier",
        "truncation",
        "stream_options",
        "client_metadata",
        *SAME_KEYS,
    }
)
_REFUSED = {
    "conversation": "conversations are not stored by the gateway; send the items as 'input' "
    "or chain calls with 'previous_response_id'",
    "background": "background responses are not supported; send the request without 'background'",
    "prompt": "stored prompt templates are not supported; send the text as 'input'",
    "max_tool_calls": "'max_tool_calls' cannot be enforced on a single model call",
}


# ---------------------------------------------------------------------------------- requests
def _text_parts(parts: Any, where: str, *, allow_images: bool) -> str | list[dict[str, Any]]:
    """Responses content (a string or parts) as chat content: a string when it is all text."""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        raise DialectError(f"{where} must be a string or a list of content parts", param=where)
    out: list[dict[str, Any]] = []
    for i, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text", "refusal", "summary_text"):
            out.append({"type": "text", "text": str(part.get("text", part.get("refusal", "")))})
        elif kind == "input_image" and allow_images and part.get("image_url"):
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail"):
                image["detail"] = part["detail"]
            out.append({"type": "image_url", "image_url": image})
        else:
            raise DialectError(
                f"{where}[{i}] has content type {kind!r}; the gateway converts input_text, "
                "output_text, refusal and input_image (by URL) parts",
                param=f"{where}[{i}].type",
            )
    if all(p["type"] == "text" for p in out):
        return "".join(p["text"] for p in out)
    return out


def _reasoning_text(item: Mapping[str, Any], where: str) -> str:
    content = item.get("content")
    parts = content if isinstance(content, list) else []
    texts = [str(c.get("text", "")) for c in parts if isinstance(c, dict)]
    summary = item.get("summary")
    if not texts and isinstance(summary, list):
        texts = [str(s.get("text", "")) for s in summary if isinstance(s, dict)]
    if not texts and isinstance(item.get("encrypted_content"), str):
        sealed = item["encrypted_content"]
        if not sealed.startswith(SEALED_PREFIX):
            raise DialectError(
                f"{where} carries encrypted reasoning the gateway did not issue; replay only "
                "reasoning items this gateway returned",
                param=f"{where}.encrypted_content",
            )
        try:
            return base64.b64decode(sealed[len(SEALED_PREFIX) :], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise DialectError(f"{where}.encrypted_content is damaged: {exc}", param=where) from exc
    return "".join(texts)


class _Items:
    """Input items folded into chat messages: consecutive reasoning / assistant message /
    function_call items are one assistant message, as the model produced them."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None

    def assistant(self) -> dict[str, Any]:
        if self._open is None:
            self._open = {"role": "assistant", "content": None}
            self.messages.append(self._open)
        return self._open

    def close(self) -> None:
        self._open = None

    def add(self, item: Any, where: str) -> None:
        if not isinstance(item, dict):
            raise DialectError(f"{where} must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            self._message(item, where)
        elif kind == "function_call":
            msg = self.assistant()
            args = item.get("arguments", "")
            msg.setdefault("tool_calls", []).append(
                {
                    "id": str(item.get("call_id") or item.get("id") or ""),
                    "type": "function",
                    "function": {
                        "name": str(item.get("name", "")),
                        "arguments": args if isinstance(args, str) else orjson.dumps(args).decode(),
                    },
                }
            )
        elif kind == "function_call_output":
            self.close()
            output = _text_parts(item.get("output", ""), f"{where}.output", allow_images=True)
            self.messages.append(
                {"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": output}
            )
        elif kind == "reasoning":
            if self._open is not None and (self._open["content"] or self._open.get("tool_calls")):
                self.close()
            msg = self.assistant()
            msg["reasoning_content"] = (msg.get("reasoning_content") or "") + _reasoning_text(
                item, where
            )
        else:
            raise DialectError(
                f"{where} is an item of type {kind!r}; the gateway converts message, "
                "function_call, function_call_output and reasoning items",
                param=f"{where}.type",
            )

    def _message(self, item: Mapping[str, Any], where: str) -> None:
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise DialectError(
                f"{where}.role is {role!r}; expected user, assistant, system or developer",
                param=f"{where}.role",
            )
        content = item.get("content", "")
        if not isinstance(content, str):
            content = _text_parts(content, f"{where}.content", allow_images=True)
        if role != "assistant":
            self.close()
            self.messages.append(
                {"role": "system" if role == "developer" else role, "content": content}
            )
            return
        if not isinstance(content, str):
            raise DialectError(f"{where}: assistant content must be text", param=where)
        if self._open is not None and (self._open["content"] or self._open.get("tool_calls")):
            self.close()
        msg = self.assistant()
        msg["content"] = content


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise DialectError("'tools' must be a list", param="tools")
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function" or not tool.get("name"):
            raise DialectError(
                f"tools[{i}] is of type {kind!r}; the gateway serves function tools only "
                "(built-in tools such as web_search or file_search run at OpenAI)",
                param=f"tools[{i}].type",
            )
        fn: dict[str, Any] = {"name": tool["name"]}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                fn[key] = tool[key]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise DialectError(
        f"tool_choice {choice!r} is not supported; use 'auto', 'none', 'required' or "
        "{'type': 'function', 'name': ...}",
        param="tool_choice",
    )


def _text_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise DialectError(f"text.format type {fmt.get('type')!r} is not supported", param="text")


def request_to_chat(
    body: Mapping[str, Any], history: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """A Responses request as a Chat Completions request (without ``stream``).

    ``history`` is the conversation ``previous_response_id`` names, as chat messages (no
    instructions: per the API, those of an earlier response are not carried over).
    """
    for key, why in _REFUSED.items():
        if body.get(key) not in (None, False):
            raise DialectError(f"'{key}': {why}", param=key)
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    elif instructions not in (None, ""):
        raise DialectError("'instructions' must be a string", param="instructions")
    messages.extend(dict(m) for m in history)
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    elif isinstance(raw, list):
        items = _Items()
        for i, item in enumerate(raw):
            items.add(item, f"input[{i}]")
        messages.extend(items.messages)
    elif raw is not None:
        raise DialectError("'input' must be a string or a list of items", param="input")
    if not messages:
        raise DialectError("the request has no input", param="input")
    chat: dict[str, Any] = {"model": body.get("model") or "policy", "messages": messages}
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for key in SAME_KEYS:
        if body.get(key) is not None:
            chat[key] = body[key]
    # Anything else (a backend's sampling extensions: top_k, min_p, ...) goes on as it came.
    chat.update((k, v) for k, v in body.items() if k not in _IGNORED and k not in _REFUSED)
    if chat.get("top_logprobs"):
        chat["logprobs"] = True
    fmt = _text_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    effort = (
        body.get("reasoning", {}).get("effort") if isinstance(body.get("reasoning"), dict) else None
    )
    if effort is not None:
        chat["reasoning_effort"] = effort
    return chat


def history_after(chat: Mapping[str, Any], reply: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The conversation a later ``previous_response_id`` continues: this call's chat messages
    (without the instructions' system message) plus the assistant reply."""
    messages = list(chat.get("messages") or ())
    if messages and messages[0].get("role") == "system":
        messages = messages[1:]
    return [*messages, reply]  # not copied: request_to_chat copies what it takes from history


def response_to_chat(response: Mapping[str, Any]) -> dict[str, Any]:
    """A ``response`` object as the ``chat.completion`` it was made from (the inverse of
    :func:`response_from_chat` on the fields both carry)."""
    items = _Items()
    for i, item in enumerate(response.get("output") or ()):
        items.add(item, f"output[{i}]")
    message = items.messages[0] if items.messages else {"role": "assistant", "content": None}
    reason = (response.get("incomplete_details") or {}).get("reason")
    finish = {v: k for k, v in INCOMPLETE_REASONS.items()}.get(reason or "")
    if finish is None:
        finish = "tool_calls" if message.get("tool_calls") else "stop"
    if message.get("reasoning_content") is not None:
        message["reasoning"] = message["reasoning_content"]
    usage = response.get("usage") or {}
    return {
        "id": response.get("id"),
        "object": "chat.completion",
        "created": response.get("created_at"),
        "model": response.get("model"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {
            "prompt_tokens": usage.get("input_tokens", 0),
            "completion_tokens": usage.get("output_tokens", 0),
            "total_tokens": usage.get("total_tokens", 0),
        },
    }
