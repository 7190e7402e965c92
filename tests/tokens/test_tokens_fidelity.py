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
ADD = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
# Three sampled turns of a tool conversation: text before the tool calls with whitespace at both
# ends and inside, whitespace between and after two blocks, then a final answer.
TOOL_TURNS = [
    "  Let me\n\n  add that up.  \n\n" + ADD + "\n \n" + ADD + "\n",
    "\tOnce more:\n" + ADD,
    " Done: 2. \n",
]
BEFORE_CALLS = ["  Let me\n\n  add that up.  \n\n", "\tOnce more:\n", " Done: 2. \n"]


def _script(messages: list[dict[str, Any]], tools: Any) -> str:
    first_user = next((m for m in messages if m.get("role") == "user"), {})
    if "tool spaces" in str(first_user.get("content")):
        return TOOL_TURNS[sum(1 for m in messages if m.get("role") == "assistant")]
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


def _tool_conversation(oai: openai.OpenAI, stream: bool) -> list[dict[str, Any]]:
    """Three calls; each reply is appended exactly as the agent got it, tool results after."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "tool spaces"}]
    for k, expected in enumerate(BEFORE_CALLS):
        if stream:
            content, calls = "", {}
            for chunk in oai.chat.completions.create(  # type: ignore[call-overload]
                model="policy", messages=messages, tools=TOOLS, stream=True, max_tokens=200
            ):
                for ch in chunk.choices:
                    content += ch.delta.content or ""
                    for d in ch.delta.tool_calls or []:
                        calls[d.index] = {
                            "id": d.id,
                            "type": "function",
                            "function": {
                                "name": d.function.name,
                                "arguments": d.function.arguments,
                            },
                        }
            msg: dict[str, Any] = {"role": "assistant", "content": content or None}
            if calls:
                msg["tool_calls"] = [calls[i] for i in sorted(calls)]
        else:
            r = oai.chat.completions.create(
                model="policy",
                messages=messages,  # type: ignore[arg-type]
                tools=TOOLS,  # type: ignore[arg-type]
                max_tokens=200,
            )
            msg = r.choices[0].message.model_dump(exclude_none=True)
        assert msg["content"] == expected  # byte for byte, whitespace and all
        assert len(msg.get("tool_calls") or ()) == [2, 1, 0][k]
        messages.append(msg)
        for call in msg.get("tool_calls") or ():
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "2"})
    return messages


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_content_before_tool_calls_is_exact_and_still_heals(
    stack: RunningGateway, renderer: Any, stream: bool
) -> None:
    with stack.client() as c:
        h = c.create_session(capture="tokens")
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        _tool_conversation(oai, stream)
        calls = c.calls(h.session_id)
        rows = c.trajectory(h.session_id)
    assert [(call.branch, call.fork_reason) for call in calls] == [(0, None)] * 3
    assert len(rows) == 1 and rows[0].fork is None
    # the row holds every sampled token once, whitespace between and after the blocks included
    sampled = [[*renderer.encode(t).tolist(), renderer.eos_id] for t in TOOL_TURNS]
    assert [call.completion_ids.tolist() for call in calls] == sampled
    mask = rows[0].loss_mask.astype(bool)
    assert rows[0].response_ids[mask].tolist() == [i for ids in sampled for i in ids]
