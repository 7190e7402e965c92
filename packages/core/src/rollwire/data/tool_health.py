"""Tool-call health of captured calls: how many tool calls the server's parser returned, and how
many answers carry tool-call-shaped text that did not parse — the drift of tool calls into plain
text under RL, and a parser set to a format the model does not emit, which otherwise train on
zero tool calls without a sign. Pure: no I/O."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rollwire.data.protocol import ModelCall

__all__ = ["ToolHealth", "tool_call_text_unparsed", "tool_health"]

#: text that looks like a tool call a parser should have turned into ``tool_calls``: a Hermes /
#: Qwen ``<tool_call>`` block, a Llama/Mistral-style special marker, or a bare JSON call object
_TOOL_CALL_TEXT = re.compile(
    r"<tool_call>|<\|python_tag\|>|\[TOOL_CALLS\]|<function="
    r"|\{\s*\"name\"\s*:\s*\"[^\"]+\"\s*,\s*\"(?:arguments|parameters)\"\s*:"
)


@dataclass
class ToolHealth:
    """Counts over a set of calls."""

    #: calls whose request offered ``tools``
    offered: int = 0
    #: tool calls the server parsed (``message.tool_calls``)
    parsed: int = 0
    #: answers whose text holds a tool call the server did not parse
    unparsed: int = 0

    @property
    def none_parsed(self) -> bool:
        """Tools were offered, and not one call came back parsed: the step to flag."""
        return self.offered > 0 and self.parsed == 0

    def add(self, call: ModelCall) -> None:
        """Count ``call``."""
        message = _message(call.response)
        self.offered += bool(call.request.get("tools"))
        self.parsed += len(message.get("tool_calls") or [])
        self.unparsed += _text_unparsed(message)

    def flags(self) -> list[str]:
        """The names a step record carries: ``no_tool_calls_parsed``, ``tool_call_text_unparsed``."""
        out = ["no_tool_calls_parsed"] if self.none_parsed else []
        return out + (["tool_call_text_unparsed"] if self.unparsed else [])

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready counts, with ``none_parsed`` (the flag)."""
        return {
            "offered": self.offered,
            "parsed": self.parsed,
            "unparsed": self.unparsed,
            "none_parsed": self.none_parsed,
        }


def tool_call_text_unparsed(call: ModelCall) -> bool:
    """True when ``call``'s answer text holds a tool call the server did not parse."""
    return _text_unparsed(_message(call.response))


def _text_unparsed(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, str) and bool(_TOOL_CALL_TEXT.search(content))


def _message(response: dict[str, Any]) -> dict[str, Any]:
    try:
        message = response["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return {}
    return message if isinstance(message, dict) else {}


def tool_health(calls: Iterable[ModelCall]) -> ToolHealth:
    """The :class:`ToolHealth` of ``calls``."""
    out = ToolHealth()
    for call in calls:
        out.add(call)
    return out
