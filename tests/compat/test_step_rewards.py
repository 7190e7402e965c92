"""A gen-1 agent's per-turn reward list through the real path (RolloutApp over HTTP, a real
gateway, the scripted embedded engine): each trainable call gets its ``step_reward``, the rollout
reward is the last element unless ``list_reward=`` says otherwise."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from rollwire.agent.serving import ServerThread
from rollwire.compat.agentcore_rl_toolkit import AgentCoreRLApp
from rollwire.data.foreign import ListReward
from rollwire.trainer.client import RolloutClient

from .dropin import math_script


@pytest.fixture(scope="module")
def gateway() -> Iterator[Any]:
    from rollwire.engine import EmbeddedEngine, EngineConfig
    from rollwire.gateway import serve_in_thread

    with (
        EmbeddedEngine(EngineConfig(scripted=math_script)) as engine,
        serve_in_thread(backends=[(engine.url, "vllm")]) as gw,
    ):
        yield gw


def _gen1_app(list_reward: ListReward = "last") -> AgentCoreRLApp:
    """A gen-1 agent as the toolkit's guide writes one: settings from ``payload["_rollout"]``,
    one model call per turn, ``{"rewards": [per-turn list]}``."""
    from openai import OpenAI

    app = AgentCoreRLApp(list_reward=list_reward)

    @app.rollout_entrypoint
    def invoke_agent(payload: dict[str, Any]) -> dict[str, Any]:
        rollout = payload["_rollout"]
        client = OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"])
        messages: list[Any] = [{"role": "user", "content": payload["prompt"]}]
        for _ in range(payload["turns"]):
            answer = client.chat.completions.create(
                model=rollout["model_id"], messages=messages, max_tokens=16
            )
            messages += [answer.choices[0].message.model_dump(exclude_none=True)]
            messages += [{"role": "user", "content": "go on"}]
        return {"rewards": payload["rewards"]}

    return app


def _run(gateway: Any, app: AgentCoreRLApp, tasks: list[dict[str, Any]]) -> list[Any]:
    with (
        ServerThread(app) as server,
        RolloutClient(gateway, runner=f"http:{server.url}", group_size=1, deadline=60) as client,
    ):
        groups = client.run(tasks)
    rollouts = [r for g in groups for r in g.rollouts]
    assert [r.status for r in rollouts] == ["completed"] * len(tasks), [r.error for r in rollouts]
    return rollouts


def _task(tid: str, turns: int, rewards: list[float]) -> dict[str, Any]:
    return {"id": tid, "prompt": "What is 17 * 23 + 4?", "turns": turns, "rewards": rewards}


def test_each_call_gets_its_step_reward_and_the_rollout_the_last(gateway: Any) -> None:
    (rollout,) = _run(gateway, _gen1_app(), [_task("three", 3, [0.1, 0.3, 1.0])])
    assert [c.step_reward for c in rollout.calls] == [0.1, 0.3, 1.0]
    assert [c.index for c in rollout.calls] == [0, 1, 2]
    assert rollout.reward == 1.0
    assert "step_rewards_dropped" not in rollout.metrics


def test_lengths_that_differ_drop_extra_rewards_and_leave_missing_ones_none(gateway: Any) -> None:
    longer, shorter = _run(
        gateway,
        _gen1_app(),
        [_task("longer", 2, [0.1, 0.2, 0.3, 1.0]), _task("shorter", 3, [0.5, 0.7])],
    )
    assert [c.step_reward for c in longer.calls] == [0.1, 0.2]
    assert longer.metrics["step_rewards_dropped"] == 2.0 and longer.reward == 1.0
    assert [c.step_reward for c in shorter.calls] == [0.5, 0.7, None]
    assert "step_rewards_dropped" not in shorter.metrics and shorter.reward == 0.7


@pytest.mark.parametrize(("list_reward", "expected"), [("sum", 1.5), ("mean", 0.5)])
def test_the_rollout_reward_can_be_the_sum_or_mean(
    gateway: Any, list_reward: ListReward, expected: float
) -> None:
    (rollout,) = _run(gateway, _gen1_app(list_reward), [_task("t", 3, [0.25, 0.25, 1.0])])
    assert rollout.reward == pytest.approx(expected)
    assert [c.step_reward for c in rollout.calls] == [0.25, 0.25, 1.0]  # the steps stay as given
