"""Agent-side clients for the dialects: wired to the session in a rollout, production otherwise."""

from __future__ import annotations

import anthropic
import openai
import pytest

from rollwire.agent.context import anthropic_client, async_anthropic_client
from rollwire.agent.openai_agents import agents_model, model_provider

PAYLOAD = {
    "prompt": "x",
    "_rollwire": {
        "session_id": "s1",
        "base_url": "http://gw:8000/s/tok/v1",
        "api_key": "tok",
        "complete_url": "http://gw:8000/api/sessions/s1/complete",
        "model": "policy-7",
    },
}


def test_anthropic_client_points_at_the_session() -> None:
    for make in (anthropic_client, async_anthropic_client):
        c = make(
            PAYLOAD,
            api_key="prod",
            base_url="https://api.anthropic.com",
            default_headers={"x-a": "1"},
        )
        assert str(c.base_url).rstrip("/") == "http://gw:8000/s/tok"  # the SDK adds /v1/messages
        assert c.api_key == "tok" and c.max_retries == 2
        assert c.default_headers["x-a"] == "1"


def test_anthropic_client_in_production() -> None:
    c = anthropic_client({"prompt": "x"}, api_key="prod")
    assert isinstance(c, anthropic.Anthropic) and c.api_key == "prod"
    assert "anthropic.com" in str(c.base_url)
    with pytest.raises(ValueError, match="lacks"):
        anthropic_client({"_rollwire": {"session_id": "s"}})


def test_agents_sdk_keeps_the_responses_model() -> None:
    from agents import OpenAIChatCompletionsModel, OpenAIResponsesModel

    production = OpenAIResponsesModel("gpt-4.1", openai.AsyncOpenAI(api_key="prod"))
    assert agents_model({"prompt": "x"}, model=production) is production
    wired = agents_model(PAYLOAD, model=production)
    assert isinstance(wired, OpenAIResponsesModel) and wired.model == "policy-7"
    assert str(wired._client.base_url).rstrip("/") == "http://gw:8000/s/tok/v1"
    by_name = agents_model(PAYLOAD, model="gpt-4.1", api="responses")
    assert isinstance(by_name, OpenAIResponsesModel)
    chat = agents_model(PAYLOAD, model="gpt-4.1")
    assert isinstance(chat, OpenAIChatCompletionsModel) and not isinstance(
        chat, OpenAIResponsesModel
    )
    provided = model_provider(PAYLOAD).get_model("gpt-5")
    assert isinstance(provided, OpenAIResponsesModel) and provided.model == "policy-7"
    with pytest.raises(ValueError, match="api must be"):
        agents_model(PAYLOAD, model="x", api="completions")


def test_strands_and_langchain_anthropic_models() -> None:
    from langchain_anthropic import ChatAnthropic
    from strands.models.anthropic import AnthropicModel

    from rollwire_langgraph import anthropic_chat_model
    from rollwire_strands import anthropic_model

    payload = {
        "_rollwire": {
            **PAYLOAD["_rollwire"],
            "sampling": {"temperature": 0.7, "min_p": 0.1, "max_tokens": 99},
        }
    }  # type: ignore[dict-item]
    m = anthropic_model(
        payload, model_id="claude-x", max_tokens=10, client_args={"api_key": "prod"}
    )
    assert isinstance(m, AnthropicModel)
    assert (
        str(m.client.base_url).rstrip("/") == "http://gw:8000/s/tok" and m.client.api_key == "tok"
    )
    cfg = m.get_config()
    assert cfg["model_id"] == "policy-7" and cfg["max_tokens"] == 99
    assert cfg["params"] == {"temperature": 0.7, "extra_body": {"min_p": 0.1}}
    prod = anthropic_model({}, model_id="claude-x", max_tokens=10, client_args={"api_key": "prod"})
    assert prod.get_config()["model_id"] == "claude-x" and prod.client.api_key == "prod"
    chat = anthropic_chat_model(payload, model="claude-x", api_key="prod", stop=["END"])
    assert isinstance(chat, ChatAnthropic) and chat.model == "policy-7"
    assert chat.anthropic_api_url == "http://gw:8000/s/tok"
    assert chat.anthropic_api_key.get_secret_value() == "tok"
    assert chat.temperature == 0.7 and chat.max_tokens == 99 and chat.stop_sequences == ["END"]
    assert chat.model_kwargs == {"min_p": 0.1}
    assert anthropic_chat_model({}, model="claude-x", api_key="prod").model == "claude-x"
