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
