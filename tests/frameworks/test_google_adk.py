"""Google ADK through rollwire: an ``LlmAgent`` with function tools on ``LiteLlm`` (ADK's way to
any OpenAI-compatible model), run by an ``InMemoryRunner``."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.agents.run_config import RunConfig, StreamingMode
from google.adk.models.lite_llm import LiteLlm
from google.adk.runners import InMemoryRunner
from google.genai import types

import rollwire
from rollwire.testing.agent import ToolTask

from .recipe_suite import Recipe, RecipeConformance


def adk_model(
    payload: Mapping[str, Any],
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    model: str = "gpt-4o",
) -> LiteLlm:
    """The recipe (docs/frameworks.md): the session's endpoint, key, model name and sampling."""
    ctx = rollwire.rollout_context(payload)
    create = rollwire.rollout_create_kwargs(payload, model=model)
    return LiteLlm(
        model="openai/" + create.pop("model"),  # LiteLLM's OpenAI-compatible provider
        api_base=ctx.base_url if ctx else base_url,
        api_key=ctx.api_key if ctx else api_key,
        **create,  # temperature, top_p, max_tokens; extra_body for top_k and the like
    )


class TestGoogleADK(RecipeConformance):
    @pytest.fixture
    def adapter(self) -> Recipe:
        return Recipe("google-adk", ("google-adk>=2.13", "litellm>=1.80"), adk_model)

    def run_agent(
        self, model: Any, task: ToolTask, *, stream: bool, payload: Mapping[str, Any]
    ) -> str:
        agent = LlmAgent(
            name="calculator",
            model=model,
            instruction=task.system_prompt,
            tools=list(task.tools),
        )
        runner = InMemoryRunner(agent=agent, app_name="calculator")
        mode = StreamingMode.SSE if stream else StreamingMode.NONE

        async def run() -> str:
            session = await runner.session_service.create_session(
                app_name="calculator", user_id="user"
            )
            message = types.Content(role="user", parts=[types.Part(text=task.prompt)])
            answer = ""
            async for event in runner.run_async(
                user_id="user",
                session_id=session.id,
                new_message=message,
                run_config=RunConfig(streaming_mode=mode),
            ):
                if event.is_final_response() and event.content and event.content.parts:
                    answer = "".join(p.text or "" for p in event.content.parts)
            await runner.close()
            return answer

        return asyncio.run(run())
