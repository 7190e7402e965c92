"""smolagents through rollwire: a ``ToolCallingAgent`` with ``@tool`` functions on ``OpenAIModel``.

A ``ToolCallingAgent`` answers only through its ``final_answer`` tool, so the stand-in endpoint and
the scripted policy finish with that call (what a model driving smolagents does).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Mapping
from typing import Any

import pytest
from smolagents import OpenAIModel, Tool, ToolCallingAgent, tool

import rollwire
from rollwire.testing.agent import RecordingServer, ToolTask, arithmetic_script

from .recipe_suite import Recipe, RecipeConformance


def smolagents_model(
    payload: Mapping[str, Any],
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    model: str = "gpt-4o",
) -> OpenAIModel:
    """The recipe (docs/frameworks.md): the session's endpoint, key, model name and sampling."""
    ctx = rollwire.rollout_context(payload)
    create = rollwire.rollout_create_kwargs(payload, model=model)
    return OpenAIModel(
        model_id=create.pop("model"),
        api_base=ctx.base_url if ctx else base_url,
        api_key=ctx.api_key if ctx else api_key,
        # smolagents asks for tool_choice="required", which vLLM serves as constrained decoding:
        # the gateway marks such calls untrainable, so the policy chooses its tool calls itself
        tool_choice="auto",
        **create,  # temperature, top_p, max_tokens; extra_body for top_k and the like
    )


def _final_answer(text: str) -> dict[str, Any]:
    call = {"name": "final_answer", "arguments": {"answer": text}}
    return {"content": "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"}


def final_answer_script(messages: list[dict[str, Any]], tools: Any = None) -> str:
    """The standard task's policy, its answer given through smolagents' ``final_answer`` tool."""
    out = arithmetic_script(messages, tools)
    return out if out.startswith("<tool_call>") else str(_final_answer(out)["content"])


class FinalAnswerServer(RecordingServer):
    """The stand-in endpoint, answering with a ``final_answer`` tool call."""

    def message(self, body: dict[str, Any]) -> dict[str, Any]:
        arguments = json.dumps({"answer": self.reply})
        call = {"id": "call-1", "type": "function"}
        call["function"] = {"name": "final_answer", "arguments": arguments}  # type: ignore[assignment]
        return {"role": "assistant", "content": None, "tool_calls": [call]}


def smolagents_tool(fn: Any) -> Tool:
    """``fn`` as a smolagents ``@tool``: its docstring gains the ``Args:`` section smolagents
    reads each argument's description from."""

    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> Any:
        return fn(**kwargs)

    args = "".join(f"\n    {name}: an integer" for name in inspect.signature(fn).parameters)
    wrapper.__doc__ = f"{inspect.getdoc(fn)}\n\nArgs:{args}"
    return tool(wrapper)


class TestSmolagents(RecipeConformance):
    recording_server = FinalAnswerServer
    script = staticmethod(final_answer_script)
    # smolagents writes each step back from its memory: the assistant's tool call returns as the
    # text "Calling tools:\n[{...}]" and its result as a user "Observation:", so every call's
    # prompt rewrites the previous completion and starts a row of its own
    expected_rows = 3

    @pytest.fixture
    def adapter(self) -> Recipe:
        return Recipe("smolagents", ("smolagents>=1.26",), smolagents_model)

    def run_agent(
        self, model: Any, task: ToolTask, *, stream: bool, payload: Mapping[str, Any]
    ) -> str:
        agent = ToolCallingAgent(
            tools=[smolagents_tool(fn) for fn in task.tools],
            model=model,
            instructions=task.system_prompt,
            stream_outputs=stream,
            max_steps=5,
            verbosity_level=0,
        )
        return str(agent.run(task.prompt))
