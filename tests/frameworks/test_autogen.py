"""AutoGen AgentChat through rollwire: an ``AssistantAgent`` with function tools on
``OpenAIChatCompletionClient`` (autogen-ext)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.base import TaskResult
from autogen_core.models import ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient

import rollwire
from rollwire.testing.agent import ToolTask

from .recipe_suite import Recipe, RecipeConformance

#: what AutoGen cannot look up for a model name it does not know (the session's is ``policy``)
POLICY_INFO = ModelInfo(
    vision=False,
    function_calling=True,
    json_output=False,
    family="unknown",
    structured_output=False,
)


def autogen_model_client(
    payload: Mapping[str, Any],
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    model: str = "gpt-4o",
) -> OpenAIChatCompletionClient:
    """The recipe (docs/frameworks.md): the session's endpoint, key, model name and sampling."""
    ctx = rollwire.rollout_context(payload)
    create = rollwire.rollout_create_kwargs(payload, model=model)
    return OpenAIChatCompletionClient(
        base_url=ctx.base_url if ctx else base_url,
        api_key=ctx.api_key if ctx else api_key,
        model_info=POLICY_INFO,
        **create,  # model, temperature, top_p, max_tokens; extra_body for top_k and the like
    )


class TestAutoGen(RecipeConformance):
    @pytest.fixture
    def adapter(self) -> Recipe:
        return Recipe(
            "autogen-agentchat",
            ("autogen-agentchat>=0.7", "autogen-ext>=0.7"),
            autogen_model_client,
        )

    def run_agent(
        self, model: Any, task: ToolTask, *, stream: bool, payload: Mapping[str, Any]
    ) -> str:
        agent = AssistantAgent(
            "calculator",
            model_client=model,
            tools=list(task.tools),
            system_message=task.system_prompt,
            model_client_stream=stream,
            max_tool_iterations=5,
        )

        async def run() -> str:
            result = None
            async for item in agent.run_stream(task=task.prompt):
                if isinstance(item, TaskResult):
                    result = item
            await model.close()
            assert result is not None
            return str(result.messages[-1].to_text())

        return asyncio.run(run())
