"""rollwire-langgraph against the shared agent-adapter suite, with a real ``create_agent`` agent."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from langchain.agents import create_agent

import rollwire_langgraph
from rollwire.testing.agent import AgentAdapterConformance, ToolTask


class TestLangGraphAdapter(AgentAdapterConformance):
    framework_modules = ("langchain_openai", "langgraph", "langchain", "openai")

    @pytest.fixture
    def adapter(self) -> rollwire_langgraph.LangGraphAdapter:
        return rollwire_langgraph.adapter

    def production_kwargs(self, *, base_url: str, api_key: str, model: str) -> dict[str, Any]:
        return {"base_url": base_url, "api_key": api_key, "model": model}

    def model_kwargs(self, *, stream: bool) -> dict[str, Any]:
        return {"streaming": stream}

    def run_agent(
        self, model: Any, task: ToolTask, *, stream: bool, payload: Mapping[str, Any]
    ) -> str:
        agent = create_agent(model, tools=task.tools, system_prompt=task.system_prompt)
        result = agent.invoke({"messages": [{"role": "user", "content": task.prompt}]})
        return str(result["messages"][-1].content)


SESSION = {
    "session_id": "s-1",
    "base_url": "http://127.0.0.1:9/s/tok/v1",
    "api_key": "tok",
    "complete_url": "http://127.0.0.1:9/api/sessions/s-1/complete",
    "model": "policy",
    "sampling": {"temperature": 0.6, "max_tokens": 64, "top_k": 20},
}


def test_session_overrides_production_aliases() -> None:
    model = rollwire_langgraph.chat_model(
        {"_rollwire": SESSION},
        model_name="gpt-5-codex",  # would switch LangChain to the Responses API
        openai_api_base="https://api.openai.com/v1",
        openai_api_key="sk-prod",
        max_completion_tokens=4096,
        reasoning_effort="low",
        extra_body={"min_p": 0.1},
        streaming=True,
        timeout=30,
    )
    assert model.model_name == "policy"
    assert model.openai_api_base == SESSION["base_url"]
    assert model.openai_api_key is not None
    assert model.openai_api_key.get_secret_value() == "tok"
    assert model.use_responses_api is False
    assert model.stream_usage is True
    assert model.streaming is True
    assert model.max_retries == 2
    assert model.request_timeout == 30
    assert model.temperature == 0.6 and model.max_tokens == 64
    assert model.extra_body == {"min_p": 0.1, "top_k": 20}
    payload = model._get_request_payload([("user", "hi")])
    assert payload["model"] == "policy" and payload["max_completion_tokens"] == 64


def test_production_is_untouched_without_a_session() -> None:
    model = rollwire_langgraph.chat_model({"prompt": "x"}, model="gpt-4o", api_key="sk-prod")
    assert model.model_name == "gpt-4o"
    assert model.openai_api_base is None
    assert model.openai_api_key is not None
    assert model.openai_api_key.get_secret_value() == "sk-prod"


def test_malformed_session_is_an_error() -> None:
    with pytest.raises(ValueError, match="_rollwire"):
        rollwire_langgraph.chat_model({"_rollwire": "nope"}, model="gpt-4o")


@pytest.mark.parametrize("key", ["timeout", "request_timeout"])
def test_a_production_timeout_never_outlasts_the_deadline(key: str) -> None:
    import time

    session = {**SESSION, "deadline": time.time() + 5}
    model = rollwire_langgraph.chat_model({"_rollwire": session}, **{key: 600})
    assert model.request_timeout <= 5
