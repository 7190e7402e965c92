"""The agent-adapter suite's 3-turn tool-using rollout against real vLLM, per framework.

The same test the adapters run against the embedded engine (``AgentAdapterConformance.
test_multi_turn_rollout_captured``: passthrough and tokens capture, streamed and not), with the
gateway in front of real vLLM; the scripted logits processor plays the engine's scripted solver.
Only that test runs here; the adapters' other suite tests need no inference server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from langchain.agents import create_agent
from strands import Agent, tool
from strands.agent.conversation_manager import NullConversationManager

import rollwire_langgraph
import rollwire_strands
from rollwire.gateway import serve_in_thread
from rollwire.testing.agent import (
    PRODUCTION_MODEL,
    AgentAdapterConformance,
    RolloutEnv,
    ToolTask,
    tool_schema,
)

from ._server import VLLMServer


class _OnVLLM(AgentAdapterConformance):
    test_declares_interface = None  # type: ignore[assignment]
    test_registered_entry_point = None  # type: ignore[assignment]
    test_entry_module_is_light = None  # type: ignore[assignment]
    test_production_fallback = None  # type: ignore[assignment]
    test_session_wiring = None  # type: ignore[assignment]

    @pytest.fixture(scope="class")
    def rollout_env(self, vllm: VLLMServer) -> Iterator[RolloutEnv]:  # type: ignore[override]
        with serve_in_thread(backends=[(vllm.url, "vllm")]) as gateway:
            yield RolloutEnv(vllm, gateway, gateway.client())


class TestOpenAIOnVLLM(_OnVLLM):
    @pytest.fixture
    def adapter(self) -> Any:
        from rollwire.agent import openai as openai_agent

        return openai_agent.adapter

    def run_agent(
        self, model: Any, task: ToolTask, *, stream: bool, payload: Mapping[str, Any]
    ) -> str:
        from rollwire.agent.context import rollout_create_kwargs

        tools = {fn.__name__: fn for fn in task.tools}
        create = rollout_create_kwargs(payload, model=PRODUCTION_MODEL)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": task.system_prompt},
            {"role": "user", "content": task.prompt},
        ]
        for _ in range(8):
            kwargs = {"messages": messages, "tools": [tool_schema(f) for f in task.tools], **create}
            if stream:
                message = _merge_stream(model.chat.completions.create(stream=True, **kwargs))
            else:
                response = model.chat.completions.create(**kwargs)
                message = response.choices[0].message.model_dump(exclude_none=True)
            messages.append(message)
            if not message.get("tool_calls"):
                return str(message.get("content") or "")
            for call in message["tool_calls"]:
                result = tools[call["function"]["name"]](
                    **json.loads(call["function"]["arguments"])
                )
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": str(result)}
                )
        raise AssertionError("the agent did not finish in 8 turns")


class TestStrandsOnVLLM(_OnVLLM):
    @pytest.fixture
    def adapter(self) -> Any:
        return rollwire_strands.adapter

    def model_kwargs(self, *, stream: bool) -> dict[str, Any]:
        return {"stream": stream}

    def run_agent(
        self, model: Any, task: ToolTask, *, stream: bool, payload: Mapping[str, Any]
    ) -> str:
        agent = Agent(
            model=model,
            tools=[tool(fn) for fn in task.tools],
            system_prompt=task.system_prompt,
            callback_handler=None,
            conversation_manager=NullConversationManager(),
        )
        return str(agent(task.prompt))


class TestLangGraphOnVLLM(_OnVLLM):
    @pytest.fixture
    def adapter(self) -> Any:
        return rollwire_langgraph.adapter

    def model_kwargs(self, *, stream: bool) -> dict[str, Any]:
        return {"streaming": stream}

    def run_agent(
        self, model: Any, task: ToolTask, *, stream: bool, payload: Mapping[str, Any]
    ) -> str:
        agent = create_agent(model, tools=task.tools, system_prompt=task.system_prompt)
        result = agent.invoke({"messages": [{"role": "user", "content": task.prompt}]})
        return str(result["messages"][-1].content)


def _merge_stream(chunks: Any) -> dict[str, Any]:
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.delta.content:
                content.append(choice.delta.content)
            for tc in choice.delta.tool_calls or []:
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
