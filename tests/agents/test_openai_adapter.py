"""The core ``openai`` adapter against the shared agent-adapter suite, with a plain tools loop."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from rollwire.agent import openai as openai_agent
from rollwire.agent.context import rollout_create_kwargs
from rollwire.testing.agent import (
    PRODUCTION_MODEL,
    AgentAdapterConformance,
    ToolTask,
    tool_schema,
)


def _merge_stream(chunks: Any) -> dict[str, Any]:
    """The assistant message of a streamed completion (tool-call deltas merged by index)."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                content.append(delta.content)
            for tc in delta.tool_calls or []:
                call = calls.setdefault(
                    tc.index,
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = tc.id or call["id"]
                if tc.function is not None:
                    call["function"]["name"] += tc.function.name or ""
                    call["function"]["arguments"] += tc.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


class TestOpenAIAdapter(AgentAdapterConformance):
    framework_modules = ("openai",)

    @pytest.fixture
    def adapter(self) -> openai_agent.OpenAIAgentAdapter:
        return openai_agent.adapter

    def production_kwargs(self, *, base_url: str, api_key: str, model: str) -> dict[str, Any]:
        return {"base_url": base_url, "api_key": api_key}

    def run_agent(
        self, model: Any, task: ToolTask, *, stream: bool, payload: Mapping[str, Any]
    ) -> str:
        tools = {fn.__name__: fn for fn in task.tools}
        # the plain client has no place for sampling: each request carries the session's, through
        # the helper agents use (so the suite's session-wiring test checks the helper)
        create = rollout_create_kwargs(payload, model=PRODUCTION_MODEL)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": task.system_prompt},
            {"role": "user", "content": task.prompt},
        ]
        for _ in range(8):
            kwargs: dict[str, Any] = {
                "messages": messages,
                "tools": [tool_schema(fn) for fn in task.tools],
                **create,
            }
            if stream:
                message = _merge_stream(model.chat.completions.create(stream=True, **kwargs))
            else:
                message = (
                    model.chat.completions.create(**kwargs)
                    .choices[0]
                    .message.model_dump(exclude_none=True)
                )
            messages.append(message)
            if not message.get("tool_calls"):
                return str(message.get("content") or "")
            for call in message["tool_calls"]:
                fn = tools[call["function"]["name"]]
                result = fn(**json.loads(call["function"]["arguments"]))
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": str(result)}
                )
        raise AssertionError("the agent did not finish in 8 turns")
