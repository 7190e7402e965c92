"""The OpenAI Agents SDK adapter against the shared agent-adapter suite, with a real ``Agent``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

agents = pytest.importorskip(
    "agents", reason="needs the OpenAI Agents SDK (pip install openai-agents)"
)

from openai import AsyncOpenAI  # noqa: E402

from rollwire.agent import openai_agents  # noqa: E402
from rollwire.testing.agent import AgentAdapterConformance, ToolTask  # noqa: E402


@pytest.fixture(autouse=True)
def _no_trace_export() -> Iterator[None]:
    # Production runs of the SDK export traces to OpenAI; tests never leave 127.0.0.1.
    agents.set_tracing_disabled(True)
    yield


class TestOpenAIAgentsAdapter(AgentAdapterConformance):
    framework_modules = ("agents",)

    @pytest.fixture
    def adapter(self) -> openai_agents.OpenAIAgentsAdapter:
        return openai_agents.adapter

    def production_kwargs(self, *, base_url: str, api_key: str, model: str) -> dict[str, Any]:
        return {"model": model, "openai_client": AsyncOpenAI(base_url=base_url, api_key=api_key)}

    def run_agent(
        self, model: Any, task: ToolTask, *, stream: bool, payload: Mapping[str, Any]
    ) -> str:
        agent = agents.Agent(
            name="calculator",
            instructions=task.system_prompt,
            model=model,
            tools=[agents.function_tool(fn) for fn in task.tools],
        )
        if not stream:
            return str(agents.Runner.run_sync(agent, task.prompt).final_output)

        async def streamed() -> str:
            result = agents.Runner.run_streamed(agent, task.prompt)
            async for _ in result.stream_events():
                pass
            return str(result.final_output)

        return asyncio.run(streamed())


def test_agents_model_disables_tracing_in_a_rollout() -> None:
    agents.set_tracing_disabled(False)
    payload = {
        "_rollwire": {
            "session_id": "s",
            "base_url": "http://127.0.0.1:9/s/t/v1",
            "api_key": "t",
            "complete_url": "http://127.0.0.1:9/api/sessions/s/complete",
        }
    }
    model = openai_agents.agents_model(payload, model="gpt-4o")
    assert model.model == "policy"
    from agents.tracing import get_trace_provider

    assert get_trace_provider()._disabled  # type: ignore[attr-defined]
