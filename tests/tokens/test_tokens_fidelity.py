"""Tokens mode hands the agent what was sampled (issue 14, item 11), through a real gateway over
the embedded engine: the backend's top log-probs, the content with its whitespace, and a flag where
``tool_choice`` is ignored."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from rollwire.engine import EmbeddedEngine, EngineConfig
from rollwire.gateway import RunningGateway, serve_in_thread

pytest.importorskip("transformers", reason="tokens mode needs rollwire[tokens]")

MSGS = [{"role": "user", "content": "hello"}]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "add", "parameters": {"type": "object", "properties": {}}},
    }
]


SPACED = "  Spaced out.\n"


def _script(messages: list[dict[str, Any]], tools: Any) -> str:
    return SPACED if messages[-1].get("content") == "spaces" else "Hello there."


@pytest.fixture(scope="module")
def stack() -> Iterator[RunningGateway]:
    cfg = EngineConfig(scripted=_script, default_max_tokens=16)
    with EmbeddedEngine(cfg) as eng, serve_in_thread(backends=[(eng.url, "vllm")]) as gw:
        yield gw


def test_top_logprobs_come_from_the_backend(stack: RunningGateway) -> None:
    with stack.client() as c:
        h = c.create_session(capture="tokens")
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        r = oai.chat.completions.create(
            model="policy", messages=MSGS, logprobs=True, top_logprobs=3
        )
        content = r.choices[0].logprobs.content  # type: ignore[union-attr]
        assert content
        for entry in content:
            assert len(entry.top_logprobs) == 3
            values = [t.logprob for t in entry.top_logprobs]
            assert values == sorted(values, reverse=True) and all(v <= 0.0 for v in values)
            assert all(isinstance(t.token, str) and t.bytes is not None for t in entry.top_logprobs)
        (call,) = c.calls(h.session_id)
        assert [e.logprob for e in content] == pytest.approx(call.logprobs.tolist(), abs=1e-6)


def test_ignored_tool_choice_is_flagged(stack: RunningGateway) -> None:
    with stack.client() as c:
        h = c.create_session(capture="tokens")
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        oai.chat.completions.create(model="policy", messages=MSGS, tools=TOOLS)  # type: ignore[arg-type]
        oai.chat.completions.create(
            model="policy",
            messages=MSGS,
            tools=TOOLS,
            tool_choice="required",  # type: ignore[arg-type]
        )
        named = {"type": "function", "function": {"name": "add"}}
        oai.chat.completions.create(
            model="policy",
            messages=MSGS,
            tools=TOOLS,
            tool_choice=named,  # type: ignore[arg-type]
        )
        auto, required, forced = c.calls(h.session_id)
        assert "tool_choice_ignored" not in auto.flags
        for call in (required, forced):
            # sampled freely, so still on-policy and trainable, but the agent can see the flag
            assert "tool_choice_ignored" in call.flags and call.trainable and not call.off_policy


def test_content_keeps_the_sampled_whitespace(stack: RunningGateway) -> None:
    with stack.client() as c:
        h = c.create_session(capture="tokens")
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        msgs = [{"role": "user", "content": "spaces"}]
        r = oai.chat.completions.create(model="policy", messages=msgs)  # type: ignore[arg-type]
        assert r.choices[0].message.content == SPACED
        # sent back as the agent got it, the history still extends the row: no fork
        history = [
            *msgs,
            {"role": "assistant", "content": SPACED},
            {"role": "user", "content": "x"},
        ]
        oai.chat.completions.create(model="policy", messages=history)  # type: ignore[arg-type]
        rows = c.trajectory(h.session_id)
        assert len(rows) == 1
