"""Split assistant text into content, reasoning (``<think>``) and Hermes ``<tool_call>`` JSON blocks."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

__all__ = ["TOOL_CALL_PARSERS", "StreamParser", "parse_assistant_text", "parse_mistral_text"]

#: the tool-call formats the engine parses (vLLM's ``--tool-call-parser`` names)
TOOL_CALL_PARSERS = ("hermes", "mistral")
_MISTRAL_OPEN = "[TOOL_CALLS]"

_TOOL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_CALL_OPEN, _CALL_CLOSE = "<tool_call>", "</tool_call>"


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _tool_call(body: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {
        "id": _call_id(),
        "type": "function",
        "function": {"name": obj["name"], "arguments": arguments},
    }


def _split_reasoning(text: str) -> tuple[str | None, str]:
    if _THINK_CLOSE in text:
        head, _, tail = text.partition(_THINK_CLOSE)
        reasoning = head.split(_THINK_OPEN)[-1].strip("\n")
        return reasoning, tail.lstrip("\n")
    stripped = text.lstrip()
    if stripped.startswith(_THINK_OPEN):
        # Cut off mid-thought (max_tokens): everything is reasoning.
        return stripped[len(_THINK_OPEN) :].lstrip("\n"), ""
    return None, text


def parse_mistral_text(text: str) -> tuple[str | None, str | None, list[dict[str, Any]]]:
    """``(content, reasoning, tool_calls)`` as a Mistral-format parser reads model output: a JSON
    list of ``{"name", "arguments"}`` after ``[TOOL_CALLS]``; anything else is content (so a
    model that writes Hermes ``<tool_call>`` blocks gets none parsed)."""
    reasoning, rest = _split_reasoning(text)
    head, marker, tail = rest.partition(_MISTRAL_OPEN)
    if not marker:
        return rest or None, reasoning, []
    try:
        items = json.loads(tail)
    except ValueError:
        return rest or None, reasoning, []
    calls = [
        call for item in (items if isinstance(items, list) else [items])
        if (call := _tool_call(json.dumps(item))) is not None
    ]  # fmt: skip
    if not calls:
        return rest or None, reasoning, []
    return head.strip() or None, reasoning, calls


def parse_assistant_text(text: str) -> tuple[str | None, str | None, list[dict[str, Any]]]:
    """Parse model output into ``(content, reasoning, tool_calls)`` (OpenAI ``tool_calls`` entries).

    Reasoning is the ``<think>`` block; each ``<tool_call>{"name", "arguments"}</tool_call>`` whose
    JSON parses becomes a call with ``arguments`` as a JSON string. With tool calls, content is the
    text before the first one (None when blank), as vLLM's Hermes parser does; blocks that fail to
    parse stay in the content.
    """
    reasoning, rest = _split_reasoning(text)
    calls: list[dict[str, Any]] = []
    first = None
    for m in _TOOL_RE.finditer(rest):
        call = _tool_call(m.group(1))
        if call is None:
            continue
        calls.append(call)
        if first is None:
            first = m.start()
    if not calls:
        return (rest if rest or reasoning is None else None), reasoning, []
    content = rest[:first].strip()
    return (content or None), reasoning, calls


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class StreamParser:
    """Incremental version of :func:`parse_assistant_text` for SSE deltas.

    ``feed(text_so_far, final)`` returns OpenAI ``delta`` fragments: ``{"content"}``,
    ``{"reasoning"}`` or ``{"tool_calls": [...]}``. Markup that might still be a tag is held back.
    """

    def __init__(self, parse_tools: bool = True, parse_reasoning: bool = True) -> None:
        self.pos = 0
        self.mode = "start"
        self.parse_tools = parse_tools
        self.parse_reasoning = parse_reasoning
        self.tool_index = 0
        self._strip_nl = False

    def feed(self, text: str, final: bool = False) -> list[dict[str, Any]]:
        """Consume ``text`` (the whole visible text so far) and return the new delta fragments."""
        out: list[dict[str, Any]] = []
        while self.pos <= len(text):
            rest = text[self.pos :]
            if self._strip_nl:
                stripped = rest.lstrip("\n")
                self.pos += len(rest) - len(stripped)
                rest = stripped
                if rest or final:
                    self._strip_nl = False
                else:
                    break
            if self.mode == "start":
                probe = rest.lstrip()
                if self.parse_reasoning and probe.startswith(_THINK_OPEN):
                    self.pos += len(rest) - len(probe) + len(_THINK_OPEN)
                    self.mode = "reasoning"
                    self._strip_nl = True
                    continue
                if self.parse_reasoning and not final and _THINK_OPEN.startswith(probe):
                    break  # could still become <think>
                self.mode = "content"
                continue
            if self.mode == "reasoning":
                i = rest.find(_THINK_CLOSE)
                if i >= 0:
                    piece = rest[:i].rstrip("\n")
                    if piece:
                        out.append({"reasoning": piece})
                    self.pos += i + len(_THINK_CLOSE)
                    self.mode = "content"
                    self._strip_nl = True
                    continue
                piece = rest if final else rest[: len(rest) - _partial_suffix(rest, _THINK_CLOSE)]
                if not final:
                    # Newlines right before </think> are not part of the reasoning; hold them.
                    piece = piece.rstrip("\n")
                if piece:
                    out.append({"reasoning": piece})
                self.pos += len(piece)
                break
            if self.mode == "content":
                i = rest.find(_CALL_OPEN) if self.parse_tools else -1
                if i >= 0:
                    piece = rest[:i]
                    if self.tool_index == 0:
                        piece = piece.rstrip()
                    if piece.strip() or (piece and self.tool_index == 0):
                        out.append({"content": piece})
                    self.pos += i + len(_CALL_OPEN)
                    self.mode = "tool"
                    continue
                piece = rest
                if self.parse_tools and not final:
                    # Hold a possible tag start, and whitespace that may precede a tool call.
                    piece = rest[: len(rest) - _partial_suffix(rest, _CALL_OPEN)].rstrip()
                if piece and (self.tool_index == 0 or piece.strip()):
                    out.append({"content": piece})
                self.pos += len(piece)
                break
            if self.mode == "tool":
                i = rest.find(_CALL_CLOSE)
                if i < 0:
                    if final:
                        out.append({"content": _CALL_OPEN + rest})
                        self.pos = len(text)
                    break
                call = _tool_call(rest[:i].strip())
                if call is None:
                    out.append({"content": _CALL_OPEN + rest[: i + len(_CALL_CLOSE)]})
                else:
                    fn = call["function"]
                    out.append(
                        {
                            "tool_calls": [
                                {
                                    "index": self.tool_index,
                                    "id": call["id"],
                                    "type": "function",
                                    "function": {"name": fn["name"], "arguments": ""},
                                }
                            ]
                        }
                    )
                    out.append(
                        {
                            "tool_calls": [
                                {
                                    "index": self.tool_index,
                                    "function": {"arguments": fn["arguments"]},
                                }
                            ]
                        }
                    )
                    self.tool_index += 1
                self.pos += i + len(_CALL_CLOSE)
                self.mode = "content"
                continue
            break
        return out
