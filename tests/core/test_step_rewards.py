"""Per-turn reward lists on the calls they belong to: ``step_reward/<i>`` metrics → the i-th
trainable call's ``step_reward`` when a rollout is assembled, and through JSONL."""

from __future__ import annotations

from pathlib import Path

from rollwire.data.dataset import read_jsonl, write_jsonl
from rollwire.data.foreign import read_result, step_metrics
from rollwire.data.rewards import attach_step_rewards
from rollwire.testing.samples import merged_rollout


def test_each_element_goes_to_its_trainable_call_and_stored_calls_are_not_touched() -> None:
    rollout = merged_rollout()
    rollout.metrics = {"turns": 3.0, **step_metrics([0.1, 0.3, 1.0])}
    out = attach_step_rewards(rollout)
    assert [c.step_reward for c in out.calls] == [0.1, 0.3, 1.0]
    assert [c.step_reward for c in rollout.calls] == [None, None, None]  # a copy
    assert out.metrics == rollout.metrics  # nothing dropped, no flag


def test_non_trainable_calls_are_skipped_when_counting_turns() -> None:
    rollout = merged_rollout()
    rollout.calls[1].trainable = False  # e.g. the agent hung up on it
    rollout.metrics = step_metrics([0.1, 1.0])
    out = attach_step_rewards(rollout)
    assert [c.step_reward for c in out.calls] == [0.1, None, 1.0]


def test_extra_rewards_are_dropped_and_counted_missing_ones_are_none() -> None:
    rollout = merged_rollout()
    rollout.metrics = step_metrics([0.1, 0.2, 0.3, 0.4, 1.0])
    longer = attach_step_rewards(rollout)
    assert [c.step_reward for c in longer.calls] == [0.1, 0.2, 0.3]
    assert longer.metrics["step_rewards_dropped"] == 2.0
    assert attach_step_rewards(longer).metrics["step_rewards_dropped"] == 2.0  # idempotent
    rollout.metrics = step_metrics([0.5])
    shorter = attach_step_rewards(rollout)
    assert [c.step_reward for c in shorter.calls] == [0.5, None, None]
    assert "step_rewards_dropped" not in shorter.metrics


def test_a_scalar_reward_or_no_steps_leaves_calls_without_step_rewards() -> None:
    rollout = merged_rollout()
    rollout.metrics = {"turns": 3.0, "step_reward/bonus": 9.0, **read_result({"reward": 1}).metrics}
    assert attach_step_rewards(rollout) is rollout
    assert all(c.step_reward is None for c in rollout.calls)


def test_step_rewards_survive_the_jsonl_round_trip(tmp_path: Path) -> None:
    rollout = merged_rollout()
    rollout.metrics = step_metrics([0.1, 0.3, 1.0])
    out = attach_step_rewards(rollout)
    path = tmp_path / "r.jsonl"
    write_jsonl(path, [out])
    (back,) = read_jsonl(path)
    assert [c.step_reward for c in back.calls] == [0.1, 0.3, 1.0]
    assert back.to_json() == out.to_json()
