"""rollwire against what rLLM's real code did with a fixed batch (``tests/data/rllm_contract.json``).

``ci/record_contract.py`` ran rLLM (the commit in the file) on the batch stored in the file:
``Episode.to_dict`` of ``rollwire_rllm.to_episodes``'s Episodes, ``transform_episodes_to_trajectory_groups``
and ``transform_trajectory_groups_to_datums`` (GRPO advantages, Tinker datums). These tests need no
rLLM: they check that rollwire still hands rLLM exactly those Episodes, and that what rLLM made of
them is what rollwire's docs promise (its rows, its advantages).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rollwire.data.protocol import Group, Rollout
from rollwire_rllm import episode_rows, to_episode_dicts

DATA = json.loads((Path(__file__).parent / "data" / "rllm_contract.json").read_text())
#: fields rLLM's ``Episode.to_dict`` writes that rollwire's dict form leaves out, at rLLM's default
RLLM_ONLY = {"session_id": None}


def _batch() -> list[Group]:
    return [
        Group(
            group_id=g["group_id"],
            task_id=g["task_id"],
            rollouts=[Rollout.from_json(json.dumps(r)) for r in g["rollouts"]],
        )
        for g in DATA["batch"]
    ]


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda o: o.tolist()))


def test_recorded_with_a_known_rllm() -> None:
    assert DATA["rllm_commit"], "record_contract.py names the rLLM commit it ran"
    assert set(DATA["cases"]) == {"grpo", "grpo_no_std"}


def test_rollwire_gives_rllm_exactly_the_recorded_episodes() -> None:
    ours = _plain(to_episode_dicts(_batch()))
    recorded = DATA["episodes"]
    assert len(ours) == len(recorded)
    for mine, theirs in zip(ours, recorded):
        extra = {k: theirs[k] for k in set(theirs) - set(mine)}
        assert extra == RLLM_ONLY, f"{theirs['id']}: rLLM's Episode has new fields {extra}"
        assert mine == {k: v for k, v in theirs.items() if k not in RLLM_ONLY}


def test_rllm_groups_by_task_id_and_drops_failed_rollouts() -> None:
    by_id = {e["id"]: e for e in DATA["episodes"]}
    assert DATA["episode_task_ids"] == [e["id"].split(":")[0] for e in DATA["episodes"]]
    for case in DATA["cases"].values():
        kept = [eid for g in case["groups"] for eid in g["episodes"]]
        with_trajectories = [e["id"] for e in DATA["episodes"] if e["trajectories"]]
        # a failed rollout is an Episode without trajectories: rLLM leaves it out of its group
        assert sorted(kept) == sorted(with_trajectories)
        assert any(not e["trajectories"] for e in DATA["episodes"])
        for g in case["groups"]:
            assert g["group_id"] == f"{g['episodes'][0].split(':')[0]}:agent"
            assert g["rewards"] == [by_id[e]["trajectories"][0]["reward"] for e in g["episodes"]]


@pytest.mark.parametrize("case", ["grpo", "grpo_no_std"])
def test_rllm_grpo_advantages_are_the_documented_ones(case: str) -> None:
    """rLLM's GRPO: (reward - group mean) / (population std + 1e-6), or without the std; one
    advantage for every step of a trajectory (broadcast)."""
    data = DATA["cases"][case]
    for g in data["groups"]:
        rewards = np.asarray(g["rewards"], dtype=np.float64)
        expected = rewards - rewards.mean()
        if data["norm_adv_by_std_in_grpo"]:
            expected = expected / (rewards.std() + 1e-6)
        for steps, want in zip(g["advantages"], expected):
            assert steps == pytest.approx([want] * len(steps), abs=1e-9)


@pytest.mark.parametrize("case", ["grpo", "grpo_no_std"])
def test_rllm_datums_are_rollwires_rows(case: str) -> None:
    """rLLM's prefix merging makes exactly rollwire's rows, and each datum is the row shifted by
    one: targets, the captured log-probs and the advantage where the policy sampled, 0 elsewhere."""
    data = DATA["cases"][case]
    advantage = {
        eid: steps[0] for g in data["groups"] for eid, steps in zip(g["episodes"], g["advantages"])
    }
    episodes = {e["id"]: e for e in DATA["episodes"]}
    rows = [
        (eid, row)
        for g in data["groups"]
        for eid in g["episodes"]
        for row in episode_rows(episodes[eid])
    ]
    assert len(rows) == len(data["datums"])
    for (eid, row), datum in zip(rows, data["datums"]):
        tokens = np.concatenate([row.prompt_ids, row.response_ids]).astype(np.int64)
        mask = np.concatenate([np.zeros(len(row.prompt_ids)), row.loss_mask]).astype(np.float64)
        logprobs = np.concatenate([np.zeros(len(row.prompt_ids)), row.logprobs * row.loss_mask])
        assert datum["model_input"] == tokens[:-1].tolist()
        assert datum["target_tokens"] == tokens[1:].astype(float).tolist()
        assert datum["mask"] == mask[1:].tolist()
        assert datum["logprobs"] == pytest.approx(logprobs[1:].tolist(), abs=1e-6)
        assert datum["advantages"] == pytest.approx((mask[1:] * advantage[eid]).tolist())
