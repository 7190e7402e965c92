"""rLLM's step as the gateway's policy version (issue 24.5), with the flow run as rLLM runs it.

rLLM is not installable in CI, and its ``AgentFlowEngine`` needs its model gateway and a trainer to
run, so ``StandInAgentFlowEngine`` is the one stand-in these tests keep: the parts of
``AgentFlowEngine`` the flow meets, written from rLLM's code (commit in
``data/rllm_contract.json``): ``set_training_step(step, mode, epoch)`` keeps
``current_step``, and each task runs ``_run_flow_only`` → ``run_agent_flow(flow, task, config)``
→ ``await flow.arun(task, config)`` with an ``AgentConfig`` that carries no step. The loops below
follow ``UnifiedTrainer``: on-policy, ``set_training_step(global_step)`` then the batch (rLLM's
verl backend pushes ``update_weights(global_step)`` in ``on_batch_end``); fully-async, the
trainer announces each sync with ``gateway.aset_weight_version(v)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from rollwire.agent.context import async_openai_client
from rollwire.engine import EmbeddedEngine, EngineConfig
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire_rllm import RollwireAgentFlow

from .conftest import AgentConfig


async def run_agent_flow(agent: Any, task: Any, config: AgentConfig) -> Any:
    """rLLM's ``run_agent_flow``: prefers ``arun``."""
    return await agent.arun(task, config)


class _RllmGateway:
    """rLLM's ``GatewayManager`` as far as weight versions go (its own trace gateway)."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.async_client = self

    def set_weight_version(self, weight_version: int) -> None:
        self.version = weight_version

    async def aset_weight_version(self, weight_version: int) -> None:
        self.version = weight_version

    async def get_weight_version(self) -> int | None:
        return self.version


class StandInAgentFlowEngine:
    """The parts of rLLM's ``AgentFlowEngine`` the flow meets (see the module docstring)."""

    def __init__(self, flow: Any) -> None:
        self.agent_flow = flow
        self.gateway = _RllmGateway()
        self.current_step, self.current_mode, self.current_epoch = 0, "train", 0

    def set_training_step(self, step: int, mode: str = "train", epoch: int = 0) -> None:
        self.current_step, self.current_mode, self.current_epoch = step, mode, epoch

    async def _run_flow_only(self, task: dict[str, Any], uid: str, is_validation: bool) -> Any:
        config = AgentConfig(
            base_url=f"http://rllm-gateway/sessions/{uid}/v1",
            model="policy",
            session_uid=uid,
            is_validation=is_validation,
        )
        return await run_agent_flow(self.agent_flow, task, config)

    async def execute_tasks(self, tasks: list[dict[str, Any]], is_validation: bool = False) -> Any:
        return await asyncio.gather(
            *(
                self._run_flow_only(t, f"{t['task_id']}:{i}", is_validation)
                for i, t in enumerate(tasks)
            )
        )


async def agent(payload: dict[str, Any]) -> float:
    client = async_openai_client(payload)
    msgs: list[Any] = [{"role": "user", "content": payload["prompt"]}]
    await client.chat.completions.create(model="policy", messages=msgs, max_tokens=8)
    return 1.0


@pytest.fixture
def gateway() -> Iterator[RunningGateway]:
    """rLLM's verl servers report no weight version of their own: vLLM's ``"default"``."""
    script = {"rules": [{"match": ".*", "reply": "4"}]}
    with (
        EmbeddedEngine(EngineConfig(scripted=script, weight_version="default")) as engine,
        serve_in_thread(backends=[(engine.url, "vllm")]) as gw,
    ):
        yield gw


def _gateway_version(gw: RunningGateway) -> tuple[str | None, int, int | None]:
    with gw.client() as c:
        info = c.staleness()
    return info["policy_version"], info["policy_seq"], info["trainer_seq"]


def _step_versions(episodes: list[Any]) -> set[Any]:
    return {
        (step["weight_version"], step["info"]["rollwire"]["policy_version"])
        for ep in episodes
        for traj in ep["trajectories"]
        for step in traj["steps"]
    }


TASKS = [{"task_id": "t1", "prompt": "2+2?"}, {"task_id": "t1", "prompt": "2+2?"}]


async def test_on_policy_steps_move_the_version(gateway: RunningGateway) -> None:
    flow = RollwireAgentFlow(agent, gateway=gateway, native=False)
    engine = StandInAgentFlowEngine(flow)
    engine.set_training_step(0, mode="val")  # val_before_train: the loaded weights
    await engine.execute_tasks(TASKS[:1], is_validation=True)
    assert _gateway_version(gateway) == ("0", 0, 0)
    engine.set_training_step(1)  # _train_batch_async: step 1 on the weights pushed before it
    first = await engine.execute_tasks(TASKS)
    assert _gateway_version(gateway) == ("0", 0, 0)
    assert _step_versions(first) == {(0, "0")}
    engine.set_training_step(2)  # after on_batch_end(1): update_weights(1)
    second = await engine.execute_tasks(TASKS)
    assert _gateway_version(gateway) == ("1", 1, 1)
    # rLLM's int Step.weight_version and rollwire's label, on every step of every Episode
    assert _step_versions(second) == {(1, "1")}
    assert flow.steps.engine is engine and flow.steps.stamp.moved == 2  # once per step

    # a flow late on step 1 (another worker, or the final validation's step numbering): ignored
    engine.set_training_step(1)
    late = await engine.execute_tasks(TASKS)
    assert _gateway_version(gateway) == ("1", 1, 1) and _step_versions(late) == {(1, "1")}
    flow.close()


async def test_fully_async_follows_the_announced_weight_versions(gateway: RunningGateway) -> None:
    flow = RollwireAgentFlow(agent, gateway=gateway, native=False, follow="weight_version")
    engine = StandInAgentFlowEngine(flow)
    engine.gateway.set_weight_version(0)  # fit_async, before any rollout
    engine.set_training_step(1)  # the async loop's once-per-epoch call: not a version
    await engine.execute_tasks(TASKS[:1])
    assert _gateway_version(gateway) == ("0", 0, 0)
    engine.set_training_step(7)
    await engine.gateway.aset_weight_version(1)  # _perform_weight_sync
    eps = await engine.execute_tasks(TASKS)
    assert _gateway_version(gateway) == ("1", 1, 1) and _step_versions(eps) == {(1, "1")}
    flow.attach(engine)  # attaching again does not wrap twice
    await engine.gateway.aset_weight_version(2)
    eps = await engine.execute_tasks(TASKS)
    assert _gateway_version(gateway) == ("2", 2, 2) and _step_versions(eps) == {(2, "2")}
    assert flow.steps.weight_version == 2 and flow.steps.stamp.moved == 3
    flow.close()


async def test_outside_an_engine_or_with_follow_off_nothing_is_stamped(
    gateway: RunningGateway,
) -> None:
    flow = RollwireAgentFlow(agent, gateway=gateway, native=False)
    config = AgentConfig(base_url="unused", model="policy", session_uid="t1:0")
    ep = await flow.arun(TASKS[0], config)  # no rLLM engine up the call chain
    assert flow.steps.engine is None and _gateway_version(gateway) == (None, 0, None)
    assert _step_versions([ep]) == {(None, None)}
    off = RollwireAgentFlow(agent, gateway=gateway, native=False, follow=None)
    engine = StandInAgentFlowEngine(off)
    engine.set_training_step(5)
    await engine.execute_tasks(TASKS[:1])
    assert _gateway_version(gateway) == (None, 0, None)
    # explicit attach works where the flow cannot see the engine (a custom loop)
    flow.attach(engine)
    await flow.arun(TASKS[0], config)
    assert _gateway_version(gateway) == ("4", 4, 4)
    with pytest.raises(ValueError, match="follow must be 'step', 'weight_version' or None"):
        RollwireAgentFlow(agent, gateway=gateway, follow="epoch")  # type: ignore[arg-type]
    flow.close()
    off.close()
