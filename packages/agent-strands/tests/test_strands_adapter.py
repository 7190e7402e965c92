"""rollwire-strands against the shared agent-adapter suite, with a real Strands ``Agent``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from strands import Agent, tool
from strands.agent.conversation_manager import NullConversationManager

import rollwire_strands
from rollwire.testing.agent import AgentAdapterConformance, ToolTask


class TestStrandsAdapter(AgentAdapterConformance):
    framework_modules = ("strands", "openai")

    @pytest.fixture
    def adapter(self) -> rollwire_strands.StrandsAdapter:
        return rollwire_strands.adapter

    def production_kwargs(self, *, base_url: str, api_key: str, model: str) -> dict[str, Any]:
        return {"client_args": {"base_url": base_url, "api_key": api_key}, "model_id": model}

    def model_kwargs(self, *, stream: bool) -> dict[str, Any]:
        return {"stream": stream}

    def run_agent(
        self, model: Any, task: ToolTask, *, stream: bool, payload: Mapping[str, Any]
    ) -> str:
        agent = Agent(
            model=model,
            tools=[tool(fn) for fn in task.tools],
            system_prompt=task.system_prompt,
            callback_handler=None,
            conversation_manager=NullConversationManager(),
        )
        return str(agent(task.prompt))


SESSION = {
    "session_id": "s-1",
    "base_url": "http://127.0.0.1:9/s/tok/v1",
    "api_key": "tok",
    "complete_url": "http://127.0.0.1:9/api/sessions/s-1/complete",
    "model": "policy",
    "sampling": {"temperature": 0.6, "max_tokens": 64, "top_k": 20},
}


def test_production_arguments_kept_where_the_session_is_silent() -> None:
    model = rollwire_strands.model(
        {"_rollwire": SESSION},
        model_id="gpt-4o",
        client_args={"api_key": "sk-prod", "default_headers": {"x-team": "a"}, "timeout": 30},
        params={"max_tokens": 4096, "temperature": 0.0, "extra_body": {"min_p": 0.1}},
        stream=False,
    )
    assert model.config["model_id"] == "policy"
    assert model.config["stream"] is False
    assert model.config["params"] == {
        "max_tokens": 64,
        "temperature": 0.6,
        "extra_body": {"min_p": 0.1, "top_k": 20},
    }
    assert model.client_args == {
        "base_url": SESSION["base_url"],
        "api_key": "tok",
        "default_headers": {"x-team": "a"},
        "timeout": 30,
        "max_retries": 2,
    }


def test_production_client_is_not_shared_with_a_rollout() -> None:
    from openai import AsyncOpenAI

    prod = AsyncOpenAI(api_key="sk-prod", base_url="http://127.0.0.1:9/v1")
    model = rollwire_strands.model({"_rollwire": SESSION}, client=prod, model_id="gpt-4o")
    assert model._custom_client is None
    assert model.client_args["base_url"] == SESSION["base_url"]


def test_production_is_untouched_without_a_session() -> None:
    model = rollwire_strands.model({"prompt": "x"}, model_id="gpt-4o", params={"temperature": 0.2})
    assert model.config == {"model_id": "gpt-4o", "params": {"temperature": 0.2}}
    assert model.client_args == {}


def test_malformed_session_is_an_error() -> None:
    with pytest.raises(ValueError, match="_rollwire"):
        rollwire_strands.model({"_rollwire": {"base_url": "x"}}, model_id="gpt-4o")


def test_a_production_timeout_never_outlasts_the_deadline() -> None:
    import time

    session = {**SESSION, "deadline": time.time() + 5}
    model = rollwire_strands.model({"_rollwire": session}, client_args={"timeout": 600})
    assert model.client_args["timeout"] <= 5
    model = rollwire_strands.model({"_rollwire": SESSION}, client_args={"timeout": 30})
    assert model.client_args["timeout"] == 30  # no deadline: production's own bound stays


def test_streamed_strands_run_on_a_moe_model_carries_routing() -> None:
    """Strands streams by default; on an MoE model every call must still carry routed experts."""
    from rollwire.agent.app import RolloutApp
    from rollwire.engine import EmbeddedEngine, EngineConfig
    from rollwire.gateway import serve_in_thread
    from rollwire.testing.agent import arithmetic_script, arithmetic_task
    from rollwire.trainer.client import RolloutClient
    from rollwire.trainer.runners import LocalRunner

    task = arithmetic_task()
    app = RolloutApp(failure_reward=-1.0)

    @app.rollout_entrypoint
    def agent(payload: dict[str, Any]) -> float:
        model = rollwire_strands.model(payload, stream=True)
        out = TestStrandsAdapter().run_agent(model, task, stream=True, payload=payload)
        return 1.0 if task.answer in out else 0.0

    cfg = EngineConfig(scripted=arithmetic_script, return_routed_experts=True)
    with EmbeddedEngine(cfg) as engine, serve_in_thread(backends=[(engine.url, "vllm")]) as gw:
        trainer = RolloutClient(
            gw,
            runner=LocalRunner(app),
            group_size=1,
            sampling={"temperature": 0.8, "max_tokens": 128},
            capture="passthrough",
            session_options={"routed_experts": True},
            deadline=120,
        )
        (group,) = trainer.run([{"id": "t-1", "prompt": task.prompt}])
        (rollout,) = group.rollouts
        assert rollout.status == "completed" and rollout.reward == 1.0, rollout.error
        with gw.client() as client:
            calls = client.calls(rollout.rollout_id)
            rows = client.trajectory(rollout.rollout_id)
    model_cfg = engine.engine.model.config
    assert len(calls) == task.expected_model_calls
    for call in calls:
        assert call.stream and call.status == "ok" and call.trainable
        assert call.routed_experts is not None, call.flags
        n = call.prompt_ids.shape[0] + call.completion_ids.shape[0] - 1
        assert call.routed_experts.shape == (n, model_cfg.n_layers, model_cfg.top_k)
        assert "routed_experts_missing" not in call.flags
    assert rows and all(r.routed_experts is not None for r in rows)
