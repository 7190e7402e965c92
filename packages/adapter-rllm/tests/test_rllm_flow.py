"""``RollwireAgentFlow`` end to end: a real gateway over the embedded engine (scripted, MoE) and a
real RolloutApp agent; the Episode must hold exactly the ids the gateway captured."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from rollwire.app import RolloutApp
from rollwire.context import async_openai_client
from rollwire.engine.server import EmbeddedEngine
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire_rllm import RollwireAgentFlow, decode_routing_matrix, episode_rows, rllm_task


@dataclass
class AgentConfig:
    """rLLM's ``AgentConfig`` shape (base_url, model, session_uid, metadata)."""

    base_url: str
    model: str
    session_uid: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Task:
    """rLLM's ``Task`` shape (id, instruction, metadata)."""

    id: str
    instruction: str
    metadata: dict[str, Any] = field(default_factory=dict)


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
        assert len(step["routing_matrices"]) == len(step["response_ids"])
        assert call.routed_experts is not None
        p = len(step["prompt_ids"])
        np.testing.assert_array_equal(
            decode_routing_matrix(step["routing_matrices"][0]), call.routed_experts[p - 1]
        )
        assert step["chat_completions"][-1]["role"] == "assistant"
    (row,) = episode_rows(ep)  # the second call extends the first: one merged row
    assert row.num_turns == 2


def test_run_is_the_sync_protocol_method(engine: EmbeddedEngine) -> None:
    # no gateway given: the flow starts one over the AgentConfig's base_url (an SGLang backend)
    with RollwireAgentFlow(agent, backend_kind="sglang", capture="tokens", native=False) as flow:
        config = AgentConfig(base_url=engine.url, model="policy", session_uid="abc")
        result: dict[str, Any] = {}
        worker = threading.Thread(
            target=lambda: result.update(ep=flow.run({"prompt": "2+2?", "task_id": "q"}, config))
        )
        worker.start()
        worker.join(120)
        ep = result["ep"]
        assert ep["id"] == "q:0" and ep["trajectories"][0]["reward"] == 1.0


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
