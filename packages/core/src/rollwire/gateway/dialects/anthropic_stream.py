"""The Anthropic Messages event stream of a finished ``message`` (SSE bytes).

``message_start`` (the message with no content yet), then per content block
``content_block_start`` → deltas (``text_delta``, ``thinking_delta`` + ``signature_delta``,
``input_json_delta``) → ``content_block_stop``, then ``message_delta`` (stop reason, output
tokens) and ``message_stop`` — what the ``anthropic`` SDK's stream accumulator and Claude Code read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson

__all__ = ["error_event", "message_events"]

_CHUNK = 64  # characters per text / thinking / JSON delta


def _sse(event: Mapping[str, Any]) -> bytes:
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def _pieces(text: str) -> list[str]:
    return [text[i : i + _CHUNK] for i in range(0, len(text), _CHUNK)]


def _block_events(block: Mapping[str, Any], index: int) -> Iterator[dict[str, Any]]:
    kind = block["type"]
    if kind == "text":
        yield {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "text", "text": ""},
        }
        for piece in _pieces(block["text"]):
            yield {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": piece},
            }
    elif kind == "thinking":
        start: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
        yield {"type": "content_block_start", "index": index, "content_block": start}
        for piece in _pieces(block["thinking"]):
            delta = {"type": "thinking_delta", "thinking": piece}
            yield {"type": "content_block_delta", "index": index, "delta": delta}
        delta = {"type": "signature_delta", "signature": block["signature"]}
        yield {"type": "content_block_delta", "index": index, "delta": delta}
    elif kind == "tool_use":
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        yield {"type": "content_block_start", "index": index, "content_block": start}
        for piece in _pieces(orjson.dumps(block["input"]).decode()):
            delta = {"type": "input_json_delta", "partial_json": piece}
            yield {"type": "content_block_delta", "index": index, "delta": delta}
    yield {"type": "content_block_stop", "index": index}


def message_events(message: Mapping[str, Any]) -> list[bytes]:
    """The SSE events that stream ``message`` (a finished Messages ``message``)."""
    usage = dict(message["usage"])
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**usage, "output_tokens": 1}  # as the API does before generation
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(message["content"]):
        events.extend(_block_events(block, index))
    events.append(
        {
            "type": "message_delta",
            "delta": {
                "stop_reason": message["stop_reason"],
                "stop_sequence": message["stop_sequence"],
            },
            "usage": {"output_tokens": usage["output_tokens"]},
        }
    )
    events.append({"type": "message_stop"})
    return [_sse(e) for e in events]


def error_event(kind: str, message: str) -> bytes:
    """An ``error`` event, as the API sends one in the middle of a stream."""
    return _sse({"type": "error", "error": {"type": kind, "message": message}})
