"""Scoring an evaluation run per setting, and running one through a client."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from rich.console import Console

from rollwire.data.protocol import Group, Rollout
from rollwire.data.trajectory import build_rows
from rollwire.evaluation import EvalSetting, result_table, run_eval, score_setting
from rollwire.testing.samples import single_turn_rollout


def _group(task: str, rewards: Sequence[float | None]) -> Group:
    rollouts = []
    for i, rw in enumerate(rewards):
        r = single_turn_rollout(f"{task}-{i}", task, 0.0)
        r.reward = rw
        if rw is None:
            r.status = "failed"
        rollouts.append(r)
    return Group(group_id=task, task_id=task, rollouts=rollouts)


def test_score_setting_by_hand() -> None:
    groups = [_group("a", [1.0, 0.0, 0.0, 1.0]), _group("b", [0.0, 0.0, None, 0.0])]
    res = score_setting(
        EvalSetting.from_sampling({"temperature": 1.0}), groups, success_threshold=1.0, ks=[1, 2, 4]
    )
    assert res.setting.name == "temperature=1.0"
    assert (res.tasks, res.attempts, res.completed, res.failed) == (2, 8, 7, 1)
    assert res.success_rate.value == pytest.approx(2 / 8)
    assert res.mean_reward.value == pytest.approx((0.5 + 0.0) / 2)  # a failed rollout scores 0
    # task a: n=4, c=2 -> pass@1 = 0.5, pass@2 = 1 - C(2,2)/C(4,2) = 5/6, pass@4 = 1; task b: 0
    assert res.pass_at_k[1].value == pytest.approx(0.25)
    assert res.pass_at_k[2].value == pytest.approx(5 / 12)
    assert res.pass_at_k[4].value == pytest.approx(0.5)
    assert [t["pass@2"] for t in res.per_task] == pytest.approx([5 / 6, 0.0])
    assert res.pass_at_k[2].low <= res.pass_at_k[2].value <= res.pass_at_k[2].high


def test_threshold_and_failure_reward() -> None:
    groups = [_group("a", [0.6, 0.4, None])]
    res = score_setting(
        EvalSetting("s", {}), groups, success_threshold=0.5, ks=[1], failure_reward=-1.0
    )
    assert res.success_rate.value == pytest.approx(1 / 3)
    assert res.mean_reward.value == pytest.approx((0.6 + 0.4 - 1.0) / 3)


class _Client:
    """Stands in for RolloutClient: rewards depend on the temperature it is run at."""

    def __init__(self) -> None:
        self.sampling: dict[str, Any] = {"max_tokens": 16}
        self.group_size = 2
        self.seen: list[tuple[dict[str, Any], int]] = []

    def run(self, tasks: Sequence[Mapping[str, Any]]) -> list[Group]:
        self.seen.append((dict(self.sampling), self.group_size))
        hot = self.sampling.get("temperature", 0.0) > 0.5
        out = []
        for t in tasks:
            rewards = [1.0 if (hot and i % 2 == 0) else 0.0 for i in range(self.group_size)]
            out.append(_group(str(t["id"]), rewards))
        return out

    async def arun(self, tasks: Sequence[Mapping[str, Any]]) -> list[Group]:
        return self.run(tasks)


def test_run_eval_per_setting_and_marks_rollouts_untrainable() -> None:
    client = _Client()
    settings = [
        EvalSetting.from_sampling({"temperature": 0.0}),
        EvalSetting.from_sampling({"temperature": 1.0}),
    ]
    kept: dict[str, list[Group]] = {}
    res = run_eval(client, [{"id": "t1"}, {"id": "t2"}], settings, k=4, ks=[1, 4], groups_out=kept)
    assert client.seen == [
        ({"max_tokens": 16, "temperature": 0.0}, 4),
        ({"max_tokens": 16, "temperature": 1.0}, 4),
    ]
    assert client.sampling == {"max_tokens": 16} and client.group_size == 2  # restored
    cold, hot = res.settings
    assert cold.pass_at_k[4].value == 0.0 and hot.pass_at_k[4].value == 1.0
    assert hot.pass_at_k[1].value == pytest.approx(0.5)
    # no evaluation rollout can become training data
    rollouts: list[Rollout] = [r for g in kept["temperature=1.0"] for r in g.rollouts]
    assert all(r.metadata["eval"]["setting"] == "temperature=1.0" for r in rollouts)
    assert all("eval" in c.flags and not c.trainable for r in rollouts for c in r.calls)
    assert all(int(row.loss_mask.sum()) == 0 for row in build_rows(kept["temperature=1.0"]))
    # side by side in one table, one column per setting
    console = Console(record=True, width=140)
    console.print(result_table(res))
    text = console.export_text()
    assert "temperature=0.0" in text and "temperature=1.0" in text and "pass@4" in text
    assert res.as_dict()["settings"][1]["pass_at_k"]["4"]["value"] == 1.0


@pytest.mark.parametrize(
    ("settings", "k", "ks", "match"),
    [
        ([], 4, None, "at least one"),
        ([EvalSetting("a", {}), EvalSetting("a", {})], 4, None, "distinct"),
        ([EvalSetting("a", {})], 0, None, "at least 1"),
        ([EvalSetting("a", {})], 4, [8], "1 <= k <= 4"),
    ],
)
def test_run_eval_rejects_bad_arguments(
    settings: list[EvalSetting], k: int, ks: list[int] | None, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        run_eval(_Client(), [{"id": "t"}], settings, k=k, ks=ks)
