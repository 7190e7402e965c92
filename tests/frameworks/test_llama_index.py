"""LlamaIndex through rollwire: a workflow ``FunctionAgent`` with function tools on ``OpenAILike``."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.llms.openai_like import OpenAILike

import rollwire
from rollwire.testing.agent import ToolTask

from .recipe_suite import Recipe, RecipeConformance


def llama_index_llm(
    payload: Mapping[str, Any],
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    model: str = "gpt-4o",
) -> OpenAILike:
    """The recipe (docs/frameworks.md): the session's endpoint, key, model name and sampling."""
    ctx = rollwire.rollout_context(payload)
    create = rollwire.rollout_create_kwargs(payload, model=model)
    return OpenAILike(
        model=create.pop("model"),
        api_base=ctx.base_url if ctx else base_url,
        api_key=ctx.api_key if ctx else api_key,
        is_chat_model=True,
        is_function_calling_model=True,
        additional_kwargs=create,  # sent with every call, over the LLM's own temperature
    )


class TestLlamaIndex(RecipeConformance):
    @pytest.fixture
    def adapter(self) -> Recipe:
        return Recipe(
            "llama-index",
            ("llama-index-core>=0.14", "llama-index-llms-openai-like>=0.8"),
            llama_index_llm,
        )

    def run_agent(
        self, model: Any, task: ToolTask, *, stream: bool, payload: Mapping[str, Any]
    ) -> str:
        agent = FunctionAgent(
            tools=list(task.tools),
            llm=model,
            system_prompt=task.system_prompt,
            streaming=stream,
        )

        async def run() -> str:
            handler = agent.run(user_msg=task.prompt)
            async for _ in handler.stream_events():
                pass
            return str(await handler)

        return asyncio.run(run())
