"""DSPy through rollwire: a ``dspy.ReAct`` program with function tools on ``dspy.LM``.

ReAct speaks DSPy's field format (``[[ ## next_tool_name ## ]]`` ...), not the API's tool calls,
and ends with a ``finish`` step and a separate answer-extraction call; so the stand-in endpoint
and the scripted policy answer in that format, as a model driving DSPy does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import dspy
import pytest

import rollwire
from rollwire.testing.agent import RecordingServer, ToolTask, arithmetic_script

from .recipe_suite import Recipe, RecipeConformance


def dspy_lm(
    payload: Mapping[str, Any],
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    model: str = "gpt-4o",
) -> dspy.LM:
    """The recipe (docs/frameworks.md): the session's endpoint, key, model name and sampling."""
    ctx = rollwire.rollout_context(payload)
    create = rollwire.rollout_create_kwargs(payload, model=model)
    return dspy.LM(
        "openai/" + create.pop("model"),  # LiteLLM's OpenAI-compatible provider
        api_base=ctx.base_url if ctx else base_url,
        api_key=ctx.api_key if ctx else api_key,
        cache=False,  # a cached answer would never reach the policy (nor be trained on)
        **create,
    )


def _fields(**values: str) -> str:
    """A completion in DSPy's ChatAdapter format."""
    body = "".join(f"[[ ## {name} ## ]]\n{value}\n\n" for name, value in values.items())
    return body + "[[ ## completed ## ]]"


def react_script(messages: list[dict[str, Any]], tools: Any = None) -> str:
    """The standard task's policy in ReAct's fields: each tool step, ``finish``, the answer."""
    text = "\n".join(str(m.get("content")) for m in messages)
    out = arithmetic_script(messages, tools)
    if "next_tool_name" not in text:  # the extraction call after ``finish``
        return _fields(reasoning="The tools computed it.", answer=out)
    if not out.startswith("<tool_call>"):
        return _fields(next_thought="I know it.", next_tool_name="finish", next_tool_args="{}")
    call = json.loads(out.removeprefix("<tool_call>").removesuffix("</tool_call>"))
    return _fields(
        next_thought=f"I use {call['name']}.",
        next_tool_name=call["name"],
        next_tool_args=json.dumps(call["arguments"]),
    )


class ReActServer(RecordingServer):
    """The stand-in endpoint: ``finish`` at once, then ``reply`` as the extracted answer."""

    def message(self, body: dict[str, Any]) -> dict[str, Any]:
        text = "\n".join(str(m.get("content")) for m in body["messages"])
        if "next_tool_name" in text:
            content = _fields(
                next_thought="Nothing to do.", next_tool_name="finish", next_tool_args="{}"
            )
        else:
            content = _fields(reasoning="Nothing to do.", answer=self.reply)
        return {"role": "assistant", "content": content}


class TestDSPy(RecipeConformance):
    recording_server = ReActServer
    script = staticmethod(react_script)
    # ReAct's ``finish`` step: one call more than a plain tools loop (the extraction call stands
    # where the loop's answering call does)
    extra_model_calls = 1
    # each ReAct step renders its whole trajectory into one new user message (the previous
    # completion comes back reformatted as ``thought_N``/``tool_name_N`` fields), so every call
    # starts a row of its own
    expected_rows = 4

    @pytest.fixture
    def adapter(self) -> Recipe:
        return Recipe("dspy", ("dspy>=3.4",), dspy_lm)

    def run_agent(
        self, model: Any, task: ToolTask, *, stream: bool, payload: Mapping[str, Any]
    ) -> str:
        signature = dspy.Signature("question -> answer", instructions=task.system_prompt)
        react = dspy.ReAct(signature, tools=task.tools, max_iters=5)
        with dspy.context(lm=model):
            if not stream:
                return str(react(question=task.prompt).answer)

            async def streamed() -> str:
                answer = ""
                async for item in dspy.streamify(react)(question=task.prompt):
                    if isinstance(item, dspy.Prediction):
                        answer = str(item.answer)
                return answer

            return asyncio.run(streamed())
