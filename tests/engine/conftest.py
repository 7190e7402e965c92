"""Shared engines for the engine tests: started once per module, always stopped."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from rollwire.engine import EmbeddedEngine, EngineConfig

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]

WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "\\1"}}\n</tool_call>'

SCRIPT: dict[str, Any] = {
    "sessions": {"sess-A": ["First scripted reply.", "<think>\nplan\n</think>\n\nSecond reply."]},
    "rules": [
        {"match": r"weather in (\w+)", "reply": WEATHER_CALL},
        {"match": r"FORCE-TEXT", "reply": "Forced answer: 42."},
    ],
}


@pytest.fixture(scope="module")
def engine() -> Iterator[EmbeddedEngine]:
    """Raw-logprobs engine with routed experts and a script."""
    with EmbeddedEngine(EngineConfig(return_routed_experts=True, scripted=SCRIPT)) as eng:
        yield eng
