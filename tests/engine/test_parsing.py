from __future__ import annotations

import json

import pytest

from rollwire.engine import parse_assistant_text
from rollwire.engine.parsing import StreamParser


def test_plain_text() -> None:
    assert parse_assistant_text("Hello world") == ("Hello world", None, [])


def test_reasoning_and_tool_calls() -> None:
    text = (
        '<think>\nI should look it up.\n</think>\n\nLet me check.\n<tool_call>\n{"name": "get_weather", '
        '"arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call>'
    )
    content, reasoning, calls = parse_assistant_text(text)
    assert reasoning == "I should look it up."
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "calc"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"


def test_bad_json_stays_content() -> None:
    text = "<tool_call>\nnot json\n</tool_call>"
    assert parse_assistant_text(text) == (text, None, [])


@pytest.mark.parametrize(
    "text",
    [
        "Just words, no markup.",
        "<think>\nhmm\n</think>\n\nAnswer.",
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
        'Sure.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "g", "arguments": {"b": "x"}}\n</tool_call>',
    ],
)
def test_stream_parser_agrees(text: str) -> None:
    for step in (1, 3, 7):
        p = StreamParser()
        frags = []
        for end in range(step, len(text) + step, step):
            frags += p.feed(text[: min(end, len(text))])
        frags += p.feed(text, final=True)
        content = "".join(f.get("content", "") for f in frags) or None
        reasoning = "".join(f.get("reasoning", "") for f in frags) or None
        names = [
            tc["function"]["name"]
            for f in frags
            for tc in f.get("tool_calls", [])
            if "name" in tc["function"]
        ]
        args = [
            tc["function"]["arguments"]
            for f in frags
            for tc in f.get("tool_calls", [])
            if "name" not in tc["function"]
        ]
        exp_content, exp_reasoning, exp_calls = parse_assistant_text(text)
        assert (content, reasoning) == (exp_content, exp_reasoning)
        assert names == [c["function"]["name"] for c in exp_calls]
        assert args == [c["function"]["arguments"] for c in exp_calls]


HERMES = '<tool_call>\n{"name": "read_code", "arguments": {"box": "N"}}\n</tool_call>'
MISTRAL = '[TOOL_CALLS][{"name": "read_code", "arguments": {"box": "N"}}]'


def test_mistral_parser_reads_its_format_and_leaves_hermes_as_text() -> None:
    from rollwire.engine.parsing import parse_mistral_text

    content, _, calls = parse_mistral_text(MISTRAL)
    assert content is None and [c["function"]["name"] for c in calls] == ["read_code"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"box": "N"}
    assert parse_mistral_text(HERMES) == (HERMES, None, [])
    assert parse_mistral_text("[TOOL_CALLS] not json") == ("[TOOL_CALLS] not json", None, [])


@pytest.mark.parametrize(("parser", "said", "parsed"), [
    ("hermes", HERMES, 1), ("mistral", HERMES, 0), ("mistral", MISTRAL, 1),
])  # fmt: skip
def test_the_engine_parses_tool_calls_with_its_configured_parser(
    parser: str, said: str, parsed: int
) -> None:
    import httpx

    from rollwire.data.protocol import ModelCall
    from rollwire.data.tool_health import tool_call_text_unparsed
    from rollwire.engine import EmbeddedEngine, EngineConfig

    tools = [{"type": "function", "function": {"name": "read_code", "parameters": {}}}]
    config = EngineConfig(scripted=lambda messages, tools: said, tool_call_parser=parser)  # type: ignore[arg-type]
    with EmbeddedEngine(config) as engine:
        body = {"model": "rollwire-tiny", "messages": [{"role": "user", "content": "hi"}],
                "tools": tools, "max_tokens": 64}  # fmt: skip
        response = httpx.post(f"{engine.url}/v1/chat/completions", json=body, timeout=30).json()
    message = response["choices"][0]["message"]
    assert len(message.get("tool_calls") or []) == parsed
    call = ModelCall(call_id="c", session_id="s", index=0, request=body, response=response)
    assert tool_call_text_unparsed(call) == (not parsed)  # the mismatch is visible
