"""``RollwireAgentFlow`` end to end: a real gateway over the embedded engine (scripted, MoE) and a
real RolloutApp agent; the Episode must hold exactly the ids the gateway captured."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rollwire.agent.app import RolloutApp
from rollwire.agent.context import async_openai_client
from rollwire.engine.server import EmbeddedEngine
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire_rllm import RollwireAgentFlow, decode_verl_routing, episode_rows, rllm_task

from .conftest import AgentConfig, Task


def _script(messages: list[dict[str, Any]], tools: Any) -> str:
    last = messages[-1]["content"] if messages else ""
    return "The answer is 4." if str(last).startswith("tool:") else "Let me compute."


app = RolloutApp()


@app.rollout_entrypoint
async def agent(payload: dict[str, Any]) -> dict[str, Any]:
    client = async_openai_client(payload)
    msgs: list[Any] = [{"role": "user", "content": payload["prompt"]}]
    r = await client.chat.completions.create(model="policy", messages=msgs)
    msgs += [{"role": "assistant", "content": r.choices[0].message.content}]
    msgs += [{"role": "user", "content": "tool: 4"}]
    r = await client.chat.completions.create(model="policy", messages=msgs)
    correct = "4" in (r.choices[0].message.content or "")
    return {"reward": 1.0 if correct else 0.0, "metrics": {"is_correct": float(correct)}}


@pytest.fixture
def engine() -> Iterator[EmbeddedEngine]:
    with EmbeddedEngine(scripted=_script, return_routed_experts=True) as eng:
        yield eng


@pytest.fixture
def gateway(engine: EmbeddedEngine) -> Iterator[RunningGateway]:
    with serve_in_thread(backends=[(engine.url, "sglang")]) as gw:
        yield gw


async def test_arun_builds_the_episode_from_captured_calls(gateway: RunningGateway) -> None:
    flow = RollwireAgentFlow(app, gateway=gateway, capture="tokens", native=False)
    config = AgentConfig(base_url="unused", model="policy", session_uid="t1:3")
    ep = await flow.arun(Task(id="t1", instruction="2+2?", metadata={"answer": "4"}), config)
    assert ep["id"] == "t1:3"
    assert ep["termination_reason"] == "env_done" and ep["is_correct"] is True
    (traj,) = ep["trajectories"]
    assert traj["reward"] == 1.0 and len(traj["steps"]) == 2
    rollout_id = ep["info"]["rollwire"]["rollout_id"]
    captured = gateway.client().calls(rollout_id)
    for step, call in zip(traj["steps"], captured):
        assert step["prompt_ids"] == call.prompt_ids.tolist()
        assert step["response_ids"] == call.completion_ids.tolist()
        np.testing.assert_allclose(step["logprobs"], call.logprobs, atol=1e-6)
        assert call.routed_experts is not None
        # rLLM's verl form: the step's whole routing, prompt and response, in one blob
        np.testing.assert_array_equal(
            decode_verl_routing(step["routing_matrices"]), call.routed_experts
        )
        assert step["chat_completions"][-1]["role"] == "assistant"
    (row,) = episode_rows(ep)  # the second call extends the first: one merged row
    assert row.num_turns == 2


def test_run_is_the_sync_protocol_method(engine: EmbeddedEngine) -> None:
    # no gateway given: the flow starts one over backends= (the real inference server)
    with RollwireAgentFlow(
        agent, backends=[(engine.url, "sglang")], capture="tokens", native=False
    ) as flow:
        config = AgentConfig(base_url="http://127.0.0.1:9/s/abc", model="policy", session_uid="abc")
        result: dict[str, Any] = {}
        worker = threading.Thread(
            target=lambda: result.update(ep=flow.run({"prompt": "2+2?", "task_id": "q"}, config))
        )
        worker.start()
        worker.join(120)
        ep = result["ep"]
        assert ep["id"] == "q:0" and ep["trajectories"][0]["reward"] == 1.0


async def test_each_rollout_ignores_rllms_session_url_and_takes_its_sampling(
    engine: EmbeddedEngine,
) -> None:
    # rLLM's AgentFlowEngine hands every rollout its own gateway session URL in base_url; those
    # are not inference servers (here: dead ports), so the flow must never route through them
    with RollwireAgentFlow(
        app, backends=[(engine.url, "sglang")], capture="tokens", sampling={"temperature": 0.5}
    ) as flow:
        flow.native = False
        eps = []
        for uid, params, validation in (
            ("t:0", {"temperature": 1.0, "max_tokens": 64}, False),
            ("t:1", {"temperature": 0.0, "max_tokens": 32}, True),
        ):
            config = AgentConfig(
                base_url=f"http://127.0.0.1:9/sessions/{uid}/v1",
                model="policy",
                session_uid=uid,
                is_validation=validation,
                sampling_params=params,
            )
            eps.append(await flow.arun({"prompt": "2+2?", "task_id": "t"}, config))
        assert [e["id"] for e in eps] == ["t:0", "t:1"]
        assert all(e["trajectories"][0]["reward"] == 1.0 for e in eps)
        assert [e["info"]["rollwire"]["is_validation"] for e in eps] == [False, True]
        gw = flow._gateway()
        for ep, temp, max_tokens in zip(eps, (1.0, 0.0), (64, 32)):
            calls = gw.client().calls(ep["info"]["rollwire"]["rollout_id"])
            assert calls and all(c.sampling.get("temperature") == temp for c in calls)
            assert all(c.sampling.get("max_tokens") == max_tokens for c in calls)


def test_flow_needs_a_rollwire_gateway_or_backends() -> None:
    with pytest.raises(ValueError, match="backends="):
        RollwireAgentFlow(agent)


async def test_run_inside_a_loop_points_to_arun(gateway: RunningGateway) -> None:
    flow = RollwireAgentFlow(app, gateway=gateway, native=False)
    with pytest.raises(RuntimeError, match="arun"):
        flow.run({"prompt": "x"}, None)


def test_task_shapes() -> None:
    assert rllm_task({"prompt": "a"}) == {"prompt": "a"}
    assert rllm_task(Task("7", "hi", {"answer": "x"})) == {
        "answer": "x",
        "prompt": "hi",
        "task_id": "7",
    }
    assert rllm_task("just text") == {"prompt": "just text"}
    with pytest.raises(ValueError, match="agent"):
        RollwireAgentFlow(None)


graded = RolloutApp()


@graded.rollout_entrypoint
async def graded_agent(payload: dict[str, Any]) -> dict[str, Any]:
    """One call; the task's ``reward`` is the reward, solved when it is 1."""
    client = async_openai_client(payload)
    msgs: list[Any] = [{"role": "user", "content": payload["prompt"]}]
    await client.chat.completions.create(model="policy", messages=msgs)
    reward = float(payload["reward"])
    return {"reward": reward, "metrics": {"solved": float(reward == 1.0)}}


async def test_training_rollouts_are_logged_every_n_as_one_step(
    gateway: RunningGateway, tmp_path: Any
) -> None:
    from rollwire.metrics_sinks.step_logger import close_shared_loggers
    from rollwire.testing.tensorboard import read_scalars

    spec = f"tensorboard:{tmp_path / 'tb'}"
    flow = RollwireAgentFlow(graded, gateway=gateway, native=False, metrics=spec, metrics_every=3)
    rewards = [1.0, 0.0, 0.5, 1.0, 0.25]
    for i, reward in enumerate(rewards):
        config = AgentConfig(base_url="http://127.0.0.1:9/v1", model="policy", session_uid=f"t:{i}")
        await flow.arun({"prompt": "2+2?", "task_id": "t", "reward": reward}, config)
    val = AgentConfig(base_url="", model="policy", session_uid="v:0", is_validation=True)
    await flow.arun({"prompt": "2+2?", "task_id": "v", "reward": 0.0}, val)  # not logged
    flow.close()  # logs the last two as step 1
    close_shared_loggers()
    steps = read_scalars(tmp_path / "tb")
    assert sorted(steps) == [0, 1]
    first, rest = steps[0], steps[1]
    assert first["rollwire/rollouts/total"] == 3 and rest["rollwire/rollouts/total"] == 2
    assert first["rollwire/reward/mean"] == pytest.approx(0.5)
    assert first["rollwire/reward/std"] == pytest.approx(float(np.std([1.0, 0.0, 0.5])))
    assert first["rollwire/solve_rate"] == pytest.approx(1 / 3)
    assert rest["rollwire/reward/mean"] == pytest.approx(0.625)
    assert rest["rollwire/solve_rate"] == pytest.approx(0.5)
    for m in (first, rest):
        assert m["rollwire/turns/mean"] == 1.0 and m["rollwire/calls/failed"] == 0
        assert m["rollwire/tokens/response"] > 0


def test_metrics_every_must_be_positive() -> None:
    with pytest.raises(ValueError, match="ROLLWIRE_METRICS_EVERY must be a positive integer"):
        RollwireAgentFlow(app, gateway="http://x", admin_key="k", metrics_every=0)
