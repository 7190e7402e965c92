"""pydantic-ai through rollwire: an ``Agent`` with function tools on ``OpenAIChatModel``."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from pydantic_ai import Agent, AgentRunResultEvent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings

import rollwire
from rollwire.testing.agent import ToolTask

from .recipe_suite import Recipe, RecipeConformance


def pydantic_ai_model(
    payload: Mapping[str, Any],
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    model: str = "gpt-4o",
) -> OpenAIChatModel:
    """The recipe (docs/frameworks.md): the session's client, model name and sampling."""
    create = rollwire.rollout_create_kwargs(payload, model=model)
    client = rollwire.async_openai_client(payload, base_url=base_url, api_key=api_key)
    return OpenAIChatModel(
        create.pop("model"),
        provider=OpenAIProvider(openai_client=client),
        settings=ModelSettings(**create),  # type: ignore[typeddict-item]
    )


class TestPydanticAI(RecipeConformance):
    @pytest.fixture
    def adapter(self) -> Recipe:
        return Recipe("pydantic-ai", ("pydantic-ai-slim>=2.31",), pydantic_ai_model)

    def run_agent(
        self, model: Any, task: ToolTask, *, stream: bool, payload: Mapping[str, Any]
    ) -> str:
        agent = Agent(model, instructions=task.system_prompt, tools=task.tools)
        if not stream:
            return str(agent.run_sync(task.prompt).output)

        async def streamed() -> str:
            output = ""
            async with agent.run_stream_events(task.prompt) as events:
                async for event in events:
                    if isinstance(event, AgentRunResultEvent):
                        output = str(event.result.output)
            return output

        return asyncio.run(streamed())
