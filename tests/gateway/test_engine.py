"""The gateway in front of the embedded engine (a real model): a scripted tool-calling agent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import pytest

from rollwire.engine import EmbeddedEngine, EngineConfig
from rollwire.gateway import RunningGateway, serve_in_thread

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {"type": "object", "properties": {"a": {}, "b": {}}},
        },
    }
]


def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str | None:
    if tools and not any(m.get("role") == "tool" for m in messages):
        return '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    return "The sum is 5."


@pytest.fixture(scope="module")
def engine_gateway() -> Iterator[tuple[EmbeddedEngine, RunningGateway]]:
    cfg = EngineConfig(scripted=script, return_routed_experts=True, default_max_tokens=64)
    with EmbeddedEngine(cfg) as eng, serve_in_thread(backends=[(eng.url, "vllm")]) as gw:
        yield eng, gw


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calling_agent_through_engine(
    engine_gateway: tuple[EmbeddedEngine, RunningGateway], stream: bool
) -> None:
    eng, gw = engine_gateway
    with gw.client() as c:
        h = c.create_session(sampling={"temperature": 1.0})
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "add 2 and 3"}]
        seen_ids: list[list[int]] = []
        for _ in range(2):
            kw: dict[str, Any] = {"extra_body": {"return_token_ids": True}}
            if stream:
                chunks = list(
                    oai.chat.completions.create(
                        model="policy", messages=messages, tools=TOOLS, stream=True, **kw
                    )
                )
                ids = [
                    t
                    for ch in chunks
                    for c_ in ch.model_dump()["choices"]
                    for t in (c_.get("token_ids") or [])
                ]
                calls: dict[int, dict[str, str]] = {}
                text = ""
                for ch in chunks:
                    for choice in ch.choices:
                        text += choice.delta.content or ""
                        for tc in choice.delta.tool_calls or ():
                            cur = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                            if tc.function is not None:
                                cur["name"] += tc.function.name or ""
                                cur["arguments"] += tc.function.arguments or ""
                tool_calls = [calls[i] for i in sorted(calls)]
            else:
                r = oai.chat.completions.create(
                    model="policy", messages=messages, tools=TOOLS, **kw
                )
                ids = r.model_dump()["choices"][0]["token_ids"]
                text = r.choices[0].message.content or ""
                tool_calls = [
                    {"name": t.function.name, "arguments": t.function.arguments}  # type: ignore[union-attr]
                    for t in r.choices[0].message.tool_calls or ()
                ]
            seen_ids.append(ids)
            if tool_calls:
                assert tool_calls[0]["name"] == "add"
                assert json.loads(tool_calls[0]["arguments"]) == {"a": 2, "b": 3}
                messages += [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {
                                    "name": "add",
                                    "arguments": tool_calls[0]["arguments"],
                                },
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "call_1", "content": "5"},
                ]
            else:
                assert text == "The sum is 5."
        calls_ = c.calls(h.session_id)
        assert len(calls_) == 2
        for call, ids in zip(calls_, seen_ids):
            np.testing.assert_array_equal(call.completion_ids, ids)
            assert call.logprobs.shape == call.completion_ids.shape
            assert np.all(call.logprobs <= 0) and call.trainable
            assert call.policy_version == "0"
        assert eng.tokenizer.decode(calls_[1].completion_ids.tolist()).startswith("The sum is 5.")
        if not stream:
            assert calls_[0].routed_experts is not None
            n = calls_[0].prompt_ids.shape[0] + calls_[0].completion_ids.shape[0]
            assert calls_[0].routed_experts.shape[0] == n - 1
        info = c.complete(h.session_id, reward=1.0)
        assert info.num_calls == 2
        rows = c.trajectory(h.session_id)
        assert sum(int(r.loss_mask.sum()) for r in rows) == sum(
            x.completion_ids.shape[0] for x in calls_
        )
