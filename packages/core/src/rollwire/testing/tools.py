"""The standard tool task agent adapters are tested on: two tool calls, then an answer that only
the tool results make possible, and the scripted policy that plays it on the embedded engine."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ToolFn", "ToolTask", "arithmetic_script", "arithmetic_task", "tool_schema"]

ToolFn = Callable[..., Any]


@dataclass
class ToolTask:
    """A tool-calling task: the prompt, the tools (plain typed functions), and what they saw."""

    prompt: str
    tools: list[ToolFn]
    system_prompt: str = "You are a careful calculator. Use the tools for every step."
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    answer: str = ""
    #: model calls the scripted engine needs to finish the task
    expected_model_calls: int = 0


def arithmetic_task() -> ToolTask:
    """(2 + 3) * 4 with an ``add`` and a ``multiply`` tool: three model calls, two tool calls."""
    task = ToolTask(
        prompt="What is (2 + 3) * 4? Use the tools.",
        tools=[],
        answer="20",
        expected_model_calls=3,
    )

    def add(a: int, b: int) -> str:
        """Add two integers."""
        task.calls.append(("add", {"a": a, "b": b}))
        return f"sum={int(a) + int(b)}"

    def multiply(a: int, b: int) -> str:
        """Multiply two integers."""
        task.calls.append(("multiply", {"a": a, "b": b}))
        return f"product={int(a) * int(b)}"

    task.tools = [add, multiply]
    return task


def _tool_call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _transcript(messages: list[dict[str, Any]]) -> str:
    parts: list[str] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "\n".join(parts)


def arithmetic_script(messages: list[dict[str, Any]], tools: Any = None) -> str:
    """The embedded engine's scripted solver for :func:`arithmetic_task` (reads tool results back)."""
    text = _transcript(messages)
    product = re.search(r"product=(-?\d+)", text)
    if product:
        return f"The answer is {product.group(1)}."
    total = re.search(r"sum=(-?\d+)", text)
    if total:
        return _tool_call("multiply", {"a": int(total.group(1)), "b": 4})
    return _tool_call("add", {"a": 2, "b": 3})


_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean"}


def tool_schema(fn: ToolFn) -> dict[str, Any]:
    """The OpenAI ``tools`` entry for a typed function (for run hooks that use a plain client)."""
    hints = {k: v for k, v in inspect.get_annotations(fn, eval_str=True).items() if k != "return"}
    return {
        "type": "function",
        "function": {
            "name": fn.__name__,
            "description": inspect.getdoc(fn) or fn.__name__,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": _JSON_TYPES.get(t, "string")} for k, t in hints.items()},
                "required": list(hints),
            },
        },
    }
