"""The Responses API event stream of a finished ``response`` object (SSE bytes).

The order is the one OpenAI's API sends and the ``openai`` SDK's stream accumulator, the Agents
SDK and Codex CLI read: ``response.created``, ``response.in_progress``, per output item
``response.output_item.added`` → its content events → ``response.output_item.done``, then
``response.completed`` (``response.incomplete`` when the output was cut short). Every event
carries an increasing ``sequence_number``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

import orjson

__all__ = ["response_events", "sse"]

_TEXT_CHUNK = 64  # characters per text delta


def sse(event: Mapping[str, Any]) -> bytes:
    """One server-sent event, named by its ``type`` as the API names them."""
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def _pieces(text: str) -> list[str]:
    return [text[i : i + _TEXT_CHUNK] for i in range(0, len(text), _TEXT_CHUNK)] or [""]


def _message_events(item: Mapping[str, Any], index: int) -> Iterator[dict[str, Any]]:
    item_id = item["id"]
    for c, part in enumerate(item["content"]):
        empty = {**part, "text": ""}
        yield {
            "type": "response.content_part.added",
            "item_id": item_id,
            "output_index": index,
            "content_index": c,
            "part": empty,
        }
        for piece in _pieces(part["text"]):
            yield {
                "type": "response.output_text.delta",
                "item_id": item_id,
                "output_index": index,
                "content_index": c,
                "delta": piece,
                "logprobs": [],
            }
        yield {
            "type": "response.output_text.done",
            "item_id": item_id,
            "output_index": index,
            "content_index": c,
            "text": part["text"],
            "logprobs": [],
        }
        yield {
            "type": "response.content_part.done",
            "item_id": item_id,
            "output_index": index,
            "content_index": c,
            "part": part,
        }


def _reasoning_events(item: Mapping[str, Any], index: int) -> Iterator[dict[str, Any]]:
    for c, part in enumerate(item.get("content") or ()):
        base = {"item_id": item["id"], "output_index": index, "content_index": c}
        for piece in _pieces(part["text"]):
            yield {"type": "response.reasoning_text.delta", **base, "delta": piece}
        yield {"type": "response.reasoning_text.done", **base, "text": part["text"]}


def _call_events(item: Mapping[str, Any], index: int) -> Iterator[dict[str, Any]]:
    base = {"item_id": item["id"], "output_index": index}
    yield {"type": "response.function_call_arguments.delta", **base, "delta": item["arguments"]}
    yield {
        "type": "response.function_call_arguments.done",
        **base,
        "name": item["name"],
        "arguments": item["arguments"],
    }


def _added(item: Mapping[str, Any]) -> dict[str, Any]:
    """An item as ``output_item.added`` shows it: in progress, with no content yet."""
    started = {**item, "status": "in_progress"}
    if item["type"] == "message":
        started["content"] = []
    elif item["type"] == "function_call":
        started["arguments"] = ""
    elif item["type"] == "reasoning":
        started["content"] = []
    return started


def _events(response: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    snapshot = copy.deepcopy(dict(response))
    snapshot.update(status="in_progress", output=[], usage=None, incomplete_details=None)
    yield {"type": "response.created", "response": snapshot}
    yield {"type": "response.in_progress", "response": snapshot}
    for index, item in enumerate(response.get("output") or ()):
        yield {"type": "response.output_item.added", "output_index": index, "item": _added(item)}
        if item["type"] == "message":
            yield from _message_events(item, index)
        elif item["type"] == "reasoning":
            yield from _reasoning_events(item, index)
        elif item["type"] == "function_call":
            yield from _call_events(item, index)
        yield {"type": "response.output_item.done", "output_index": index, "item": item}
    final = (
        "response.incomplete" if response.get("status") == "incomplete" else "response.completed"
    )
    yield {"type": final, "response": response}


def response_events(response: Mapping[str, Any]) -> list[bytes]:
    """The SSE events that stream ``response`` (a finished ``response`` object)."""
    return [sse({**event, "sequence_number": n}) for n, event in enumerate(_events(response))]
