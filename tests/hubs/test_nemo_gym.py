"""NeMo Gym (``nemo-gym``): ``rollwire.envs.hubs.nemo_gym:app`` posts each task (a NeMo Gym
dataset row) to the vault agent server's ``/run`` (``examples/hubs/nemo_gym_vault.py``, on the
NeMo Gym venv's Python 3.12), whose model server is rollwire's; ``verify``'s reward is the reward;
``rollwire train`` trains it."""

from __future__ import annotations

from typing import Any

import pytest

from ._training import assert_trained, step_rollouts

AGENT = "rollwire.envs.hubs.nemo_gym:app"

pytestmark = pytest.mark.timeout(1800)


def test_verify_is_the_reward_and_every_model_call_is_captured(
    nemo_gym: dict[str, str], run_groups: Any
) -> None:
    import make_tasks

    (task,) = make_tasks.nemo_gym_tasks(1, "train", 0, nemo_gym["agent_url"])
    (group,) = run_groups(AGENT, [{**task, "task_id": "t0"}])
    for rollout in group.rollouts:
        assert rollout.status == "completed", rollout.error
        assert rollout.reward == pytest.approx(1.2)  # a read (0.1), of the box (0.1), opened (1)
        assert rollout.metrics["read_code"] == rollout.metrics["read_right_box"] == 1.0
        assert rollout.metrics["open_attempts"] == 1.0 and rollout.metrics["tool_calls"] == 2.0
        assert "code" not in rollout.metrics  # the row's own fields are not verify's numbers
        # the agent's Responses calls, through rollwire's model server into this session
        assert len(rollout.calls) == 3
        messages = [c.response["choices"][0]["message"] for c in rollout.calls]
        names = [t["function"]["name"] for m in messages for t in m.get("tool_calls") or []]
        assert names == ["read_code", "open_box"]


def test_a_call_without_a_live_session_is_refused(nemo_gym: dict[str, str]) -> None:
    import httpx

    from rollwire.envs.hubs.nemo_gym import model_server

    host, port = nemo_gym["model"].rsplit(":", 1)
    model_server.start(host, int(port))  # as a rollout starts it
    body = {"input": "hi", "metadata": {"rollwire_session_id": "nobody"}}
    answer = httpx.post(f"http://{nemo_gym['model']}/v1/responses", json=body)
    assert answer.status_code == 400
    assert "no live rollout session 'nobody'" in answer.json()["error"]["message"]


def test_rollwire_train_trains_a_nemo_gym_environment(nemo_gym: dict[str, str], train: Any) -> None:
    run = train("nemo-gym", nemo_gym["agent_url"], AGENT)
    assert_trained(run)
    for rollout in step_rollouts(run, 2):
        reads = 0.1 * (rollout["metrics"]["read_code"] + rollout["metrics"]["read_right_box"])
        assert rollout["reward"] - reads in (pytest.approx(0.0), pytest.approx(1.0))
