"""A scripted five-turn tool task on the embedded engine behind a real gateway, for every dialect."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollwire.engine import EmbeddedEngine, EngineConfig
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.gateway.tokens.render import ChatRenderer

SYSTEM = "You add numbers with the add tool."
TASK = "Add 1 and 2, then 3 and 4, then 7 and 3, then 10 and 0."
# What the policy "samples" at turn k (teacher-forced by the engine; log-probs stay the model's).
SCRIPT = [
    '<think>\nStart with the first pair.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
    '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>',
    'Next pair.\n<tool_call>\n{"name": "add", "arguments": {"a": 7, "b": 3}}\n</tool_call>',
    '<think>\nLast one.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 10, "b": 0}}\n</tool_call>',
    "The total is 10.",
]
PARAMETERS = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


def script(messages: list[dict[str, Any]], tools: Any) -> str | None:
    """Turn k of the task gets SCRIPT[k] (k = assistant turns so far); other chats sample."""
    first_user = next((m for m in messages if m.get("role") == "user"), None)
    text = json.dumps(first_user.get("content")) if first_user else ""
    if TASK not in text:
        return None
    k = sum(1 for m in messages if m.get("role") == "assistant")
    return SCRIPT[k] if k < len(SCRIPT) else "Done."


def expected(k: int) -> tuple[str, str, list[tuple[str, dict[str, Any]]]]:
    """(reasoning, text, tool calls) turn k's scripted completion stands for."""
    forced = SCRIPT[k]
    think = re.search(r"<think>\n(.*?)\n</think>\n\n", forced, re.DOTALL)
    reasoning = think.group(1) if think else ""
    rest = forced[think.end() :] if think else forced
    calls = [
        (c["name"], c["arguments"])
        for c in (json.loads(m) for m in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", rest))
    ]
    text = re.sub(r"<tool_call>.*?</tool_call>", "", rest, flags=re.DOTALL).strip()
    return reasoning, text, calls


@pytest.fixture(scope="session")
def engine() -> Iterator[EmbeddedEngine]:
    cfg = EngineConfig(scripted=script, return_routed_experts=True, default_max_tokens=256)
    with EmbeddedEngine(cfg) as eng:
        yield eng


@pytest.fixture(scope="session")
def gateway(engine: EmbeddedEngine) -> Iterator[RunningGateway]:
    with serve_in_thread(backends=[(engine.url, "vllm")]) as gw:
        yield gw


@pytest.fixture(scope="session")
def renderer() -> ChatRenderer:
    from rollwire.engine import tokenizer_dir

    return ChatRenderer.from_dir(Path(tokenizer_dir()))
