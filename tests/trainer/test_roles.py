"""One policy per role in the loop's pure parts: role names, a rollout's calls split by the
model they asked for, and the step's sync figures over the roles' syncs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rollwire.data.protocol import ModelCall, Rollout
from rollwire.trainer.roles import call_role, check_roles, merged_sync, role_rollouts
from rollwire.trainer.sync_report import BackendSync, SyncReport
from rollwire.trainer.train_batch import build_train_batch


def _call(i: int, model: str | None, prompt: list[int]) -> ModelCall:
    request: dict[str, Any] = {"messages": [{"role": "user", "content": str(i)}]}
    if model is not None:
        request["model"] = model
    return ModelCall(
        call_id=f"c{i}", session_id="s", index=i, request=request,
        prompt_ids=np.array(prompt, np.int32), completion_ids=np.array([7, 8], np.int32),
        logprobs=np.array([-0.5, -0.5], np.float32), finish_reason="stop",
    )  # fmt: skip


def _rollout(rid: str, reward: float) -> Rollout:
    calls = [_call(0, "planner", [1, 2, 3]), _call(1, "executor", [4, 5]), _call(2, None, [6])]
    return Rollout(rollout_id=rid, group_id="g", calls=calls, reward=reward, status="completed")


def test_roles_are_checked() -> None:
    assert check_roles(["planner", " executor"]) == ["planner", "executor"]
    for bad in (["a@1"], ["a", "a"], ["default"], [""]):
        with pytest.raises(ValueError, match="--roles"):
            check_roles(bad)


def test_each_roles_rows_hold_its_calls_alone_with_the_rollouts_advantage() -> None:
    rollouts = [_rollout("r0", 0.0), _rollout("r1", 1.0)]
    assert [call_role(c) for c in rollouts[0].calls] == ["planner", "executor", None]
    whole = build_train_batch(rollouts)
    for role, prompt in (("planner", [1, 2, 3]), ("executor", [4, 5])):
        split = role_rollouts(rollouts, role)
        assert all([c.request["model"] for c in r.calls] == [role] for r in split)
        batch = build_train_batch(split)
        assert [r.prompt_ids.tolist() for r in batch.rows] == [prompt, prompt]
        assert batch.advantages == whole.advantages  # rewards per rollout, as for one policy
        assert batch.trained_tokens == 4
    assert len(rollouts[0].calls) == 3  # the rollouts themselves are left alone


def test_the_steps_sync_figures_add_times_and_keep_servers_verified_for_every_role() -> None:
    reports = []
    for diff in (1e-5, 2e-5):
        report = SyncReport(version="1", kind="adapter", push_seconds=1.0)
        report.backends.append(BackendSync(name="b", url="u", kind="vllm", verified=True,
                                           max_abs_diff=diff))  # fmt: skip
        reports.append(report)
    out = merged_sync(reports)
    assert out["sync/push_s"] == 2.0 and out["sync/servers_verified"] == 1.0
    assert out["sync/probe_max_abs_diff"] == 2e-5 and out["sync/adapter"] == 1.0
