"""The payload contract (DESIGN §7) on the agent side: the typed context and the model clients,
which fall back to the production configuration when the payload has no ``_rollwire`` key."""

from __future__ import annotations

import time
from typing import Any

import openai
import pytest

from rollwire.agent.context import (
    async_openai_client,
    openai_client,
    rollout_context,
    rollout_create_kwargs,
    rollout_model,
)
from rollwire.plugins import load_agent

ROLLWIRE: dict[str, Any] = {
    "version": 1,
    "session_id": "sess",
    "base_url": "http://gw.test/s/TOKEN/v1",
    "api_key": "TOKEN",
    "model": "policy-7b",
    "sampling": {"temperature": 0.7},
    "complete_url": "http://gw.test/api/sessions/sess/complete",
    # far enough that a long suite run never reaches it (tests that need a near one set their own)
    "deadline": time.time() + 3600,
    "group_id": "g1",
    "task_id": "t1",
}
PAYLOAD: dict[str, Any] = {"prompt": "p", "_rollwire": ROLLWIRE}


def test_rollout_context_is_a_typed_view() -> None:
    ctx = rollout_context(PAYLOAD)
    assert ctx is not None
    assert (ctx.session_id, ctx.model, ctx.group_id, ctx.task_id) == (
        "sess",
        "policy-7b",
        "g1",
        "t1",
    )
    assert ctx.sampling == {"temperature": 0.7}
    remaining = ctx.remaining()
    assert remaining is not None and 0 < remaining <= 3600
    assert rollout_context(ctx.to_payload() and {"_rollwire": ctx.to_payload()}) == ctx
    assert rollout_context({"prompt": "x"}) is None
    assert rollout_context("not a dict") is None


@pytest.mark.parametrize(
    "bad", [{"session_id": "s"}, "text", {**ROLLWIRE, "deadline": float("nan")}]
)
def test_malformed_rollwire_key_raises(bad: object) -> None:
    with pytest.raises(ValueError):
        rollout_context({"_rollwire": bad})


def test_openai_client_is_wired_to_the_session() -> None:
    client = openai_client(
        PAYLOAD,
        api_key="prod-key",
        base_url="https://api.openai.com/v1",
        default_headers={"x-app": "1"},
    )
    assert str(client.base_url).rstrip("/") == "http://gw.test/s/TOKEN/v1"
    assert client.api_key == "TOKEN"
    assert client.max_retries == 2
    assert client.default_headers["x-app"] == "1"
    assert isinstance(client.timeout, float) and client.timeout <= 600
    aclient = async_openai_client(PAYLOAD)
    assert isinstance(aclient, openai.AsyncOpenAI) and aclient.api_key == "TOKEN"
    assert rollout_model(PAYLOAD, "gpt-4o") == "policy-7b"


def test_no_rollwire_key_means_production_configuration() -> None:
    client = openai_client(
        {"prompt": "p"}, api_key="prod-key", base_url="https://example.test/v1", max_retries=5
    )
    assert client.api_key == "prod-key" and client.max_retries == 5
    assert str(client.base_url).startswith("https://example.test/v1")
    aclient = async_openai_client({"prompt": "p"}, api_key="prod-key")
    assert aclient.api_key == "prod-key"
    assert rollout_model({"prompt": "p"}, "gpt-4o") == "gpt-4o"


def test_openai_agent_adapter_is_registered_and_builds_clients() -> None:
    adapter = load_agent("openai")
    assert adapter.name == "openai" and "openai>=1.60" in adapter.requires
    assert adapter.model(PAYLOAD).api_key == "TOKEN"
    assert adapter.model({}, api_key="prod").api_key == "prod"


def test_agent_side_imports_stay_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, rollwire.agent.app, rollwire.agent.context, rollwire.agent.openai;"
        "bad=[m for m in ('numpy','rollwire.gateway','rollwire.engine','openai') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "", f"agent-side import pulled in: {out}"


def test_a_production_timeout_never_outlasts_the_deadline() -> None:
    soon = {**PAYLOAD, "_rollwire": {**ROLLWIRE, "deadline": time.time() + 5}}
    client = openai_client(soon, timeout=600.0)
    assert isinstance(client.timeout, float) and client.timeout <= 5
    later = {**PAYLOAD, "_rollwire": {**ROLLWIRE, "deadline": time.time() + 3600}}
    assert openai_client(later, timeout=30).timeout == 30  # shorter than the deadline: kept


def test_rollout_create_kwargs_lays_the_session_over_production() -> None:
    payload = {
        "_rollwire": {**ROLLWIRE, "sampling": {"temperature": 0.7, "max_tokens": 64, "top_k": 20}}
    }
    got = rollout_create_kwargs(
        payload, model="gpt-4o", temperature=0.0, extra_body={"min_p": 0.1}, tool_choice="auto"
    )
    assert got == {
        "model": "policy-7b",
        "temperature": 0.7,
        "max_tokens": 64,
        "tool_choice": "auto",
        "extra_body": {"min_p": 0.1, "top_k": 20},
    }
    production = rollout_create_kwargs({"prompt": "p"}, model="gpt-4o", temperature=0.0)
    assert production == {"model": "gpt-4o", "temperature": 0.0}
