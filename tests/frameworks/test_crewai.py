"""CrewAI through rollwire: a one-agent ``Crew`` with ``@tool`` functions on ``crewai.LLM``
(CrewAI's native OpenAI provider, with the API's tool calls)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import pytest

with warnings.catch_warnings():
    # crewai.rag's lazily loaded submodules raise an ImportWarning, an error under our config
    warnings.simplefilter("ignore", ImportWarning)
    from crewai import LLM, Agent, Crew, Task
    from crewai.tools import tool

import rollwire
from rollwire.testing.agent import ToolTask

from .recipe_suite import Recipe, RecipeConformance


def crewai_llm(
    payload: Mapping[str, Any],
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    model: str = "gpt-4o",
    stream: bool = False,
) -> LLM:
    """The recipe (docs/frameworks.md): the session's endpoint, key, model name and sampling."""
    ctx = rollwire.rollout_context(payload)
    create = rollwire.rollout_create_kwargs(payload, model=model)
    return LLM(
        model="openai/" + create.pop("model"),
        base_url=ctx.base_url if ctx else base_url,
        api_key=ctx.api_key if ctx else api_key,
        stream=stream,
        **create,  # temperature, top_p, max_tokens; extra_body for top_k and the like
    )


class TestCrewAI(RecipeConformance):
    @pytest.fixture
    def adapter(self) -> Recipe:
        return Recipe("crewai", ("crewai>=1.15",), crewai_llm)

    def model_kwargs(self, *, stream: bool) -> dict[str, Any]:
        return {"stream": stream}

    def run_agent(
        self, model: Any, task: ToolTask, *, stream: bool, payload: Mapping[str, Any]
    ) -> str:
        calculator = Agent(
            role="calculator",
            goal="Answer arithmetic questions exactly",
            backstory=task.system_prompt,
            tools=[tool(fn) for fn in task.tools],
            llm=model,
        )
        work = Task(description=task.prompt, expected_output="the number", agent=calculator)
        return str(Crew(agents=[calculator], tasks=[work]).kickoff().raw)
