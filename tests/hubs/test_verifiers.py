"""Prime Intellect verifiers (``verifiers.v1``): ``rollwire.envs.hubs.verifiers_env:app`` runs
the ``verifiers_vault`` taskset (``examples/hubs/verifiers_vault.py``) with a verifiers agent
whose model endpoint is the rollout session; the trace's weighted rewards are the reward;
``rollwire train`` trains it."""

from __future__ import annotations

from typing import Any

import pytest

from ._training import assert_trained, step_rollouts

AGENT = "rollwire.envs.hubs.verifiers_env:app"

pytestmark = pytest.mark.timeout(1800)


def test_the_traces_rewards_are_the_reward_and_every_call_is_captured(run_groups: Any) -> None:
    import make_tasks

    task = make_tasks.verifiers_tasks(2, "train", 0)[1]
    (group,) = run_groups(AGENT, [{**task, "task_id": "t0"}])
    for rollout in group.rollouts:
        assert rollout.status == "completed", rollout.error
        # the weighted @vf.reward scores: a read (0.1), of the task's box (0.1), opened (1)
        assert rollout.reward == pytest.approx(1.2)
        scores = ("reward/read_code", "reward/read_right_box", "reward/opened")
        assert [rollout.metrics[k] for k in scores] == [1.0, 1.0, 1.0]
        # every model call of verifiers' chat program went through the session
        calls = [c.response["choices"][0]["message"] for c in rollout.calls]
        names = [t["function"]["name"] for m in calls for t in m.get("tool_calls") or []]
        assert names == ["read_code", "open_box"]
        offered = {t["function"]["name"] for t in rollout.calls[0].request["tools"]}
        assert offered == {"read_code", "open_box"}


def test_an_unknown_task_fails_the_rollout_with_the_reason(run_groups: Any) -> None:
    task = {"task_id": "t0", "taskset": "verifiers_vault", "taskset_config": {"num_tasks": 2},
            "task_idx": 7}  # fmt: skip
    (group,) = run_groups(AGENT, [task])
    for rollout in group.rollouts:
        assert rollout.status == "failed"
        assert "no task 7" in (rollout.error or "")


def test_rollwire_train_trains_a_verifiers_taskset(train: Any) -> None:
    run = train("verifiers", "", AGENT)
    assert_trained(run)
    for rollout in step_rollouts(run, 2):
        m = rollout["metrics"]
        parts = 0.1 * (m["reward/read_code"] + m["reward/read_right_box"]) + m["reward/opened"]
        assert parts == pytest.approx(rollout["reward"])
