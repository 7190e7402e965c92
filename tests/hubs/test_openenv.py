"""OpenEnv (``openenv-core``): ``rollwire.envs.hubs.openenv:app`` plays the vault environment
served by ``examples/hubs/openenv_vault.py`` over its WebSocket session and MCP tools; the
environment's per-step rewards land on the calls that earned them; ``rollwire train`` trains it."""

from __future__ import annotations

from typing import Any

import pytest

from ._training import assert_trained, step_rollouts

AGENT = "rollwire.envs.hubs.openenv:app"

pytestmark = pytest.mark.timeout(1800)


def test_per_step_rewards_land_on_the_calls_that_earned_them(
    openenv_url: str, run_groups: Any
) -> None:
    import make_tasks

    (task,) = make_tasks.openenv_tasks(1, "train", 0, openenv_url)
    (group,) = run_groups(AGENT, [{**task, "task_id": "t0"}])
    for rollout in group.rollouts:
        assert rollout.status == "completed", rollout.error
        # read the box's code (0.1 for a read, 0.1 for the task's box), then opened it (1.0)
        assert rollout.reward == pytest.approx(1.2)
        assert rollout.metrics["done"] == 1.0 and rollout.metrics["turns"] == 2.0
        assert [c.step_reward for c in rollout.calls] == pytest.approx([0.2, 1.0])
        first, second = (c.response["choices"][0]["message"]["tool_calls"] for c in rollout.calls)
        assert first[0]["function"]["name"] == "read_code"
        assert second[0]["function"]["name"] == "open_box"
        # the server's MCP tools were offered to the policy as OpenAI tools
        names = {t["function"]["name"] for t in rollout.calls[0].request["tools"]}
        assert names == {"read_code", "open_box"}


def test_a_task_without_a_server_fails_the_rollout_with_the_reason(run_groups: Any) -> None:
    (group,) = run_groups(AGENT, [{"task_id": "t0", "prompt": "Open box A."}])
    for rollout in group.rollouts:
        assert rollout.status == "failed"
        assert "env_url" in (rollout.error or "")


def test_rollwire_train_trains_an_openenv_environment(openenv_url: str, train: Any) -> None:
    run = train("openenv", openenv_url, AGENT)
    assert_trained(run)
    # the per-step rewards were trained on: each rollout's steps add up to its reward
    for rollout in step_rollouts(run, 2):
        turns = [v for k, v in rollout["metrics"].items() if k.startswith("step_reward/")]
        assert sum(turns) == pytest.approx(rollout["reward"])


def test_rollwire_run_takes_an_openenv_environment(openenv_url: str, tmp_path: Any) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    import make_tasks

    from rollwire.data.dataset import read_jsonl

    make_tasks.write(tmp_path, "openenv", openenv_url, n=2, heldout=1)
    rollwire = str(Path(sys.executable).with_name("rollwire"))
    args = ["run", "--agent", AGENT, "--tasks", "tasks.jsonl", "-n", "2", "--backend", "embedded"]
    proc = subprocess.run(
        [rollwire, *args, "--out", "out.jsonl", "--no-progress"],
        cwd=tmp_path, capture_output=True, text=True, env=dict(os.environ), timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rollouts = read_jsonl(tmp_path / "out.jsonl")
    assert len(rollouts) == 4 and all(r.status == "completed" for r in rollouts)
    assert all(r.calls and r.calls[0].request.get("tools") for r in rollouts)
