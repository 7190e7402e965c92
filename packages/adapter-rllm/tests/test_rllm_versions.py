"""Weight versions and step credit on rLLM Episodes (issues 23.4, 25.2, 25.5), hand-computed."""

from __future__ import annotations

from typing import Any

import numpy as np

from rollwire.data.credit import StepCredit
from rollwire.testing import merged_rollout, sample_batch
from rollwire.testing.samples import versioned_rollout
from rollwire_rllm import to_episode_dicts
from rollwire_rllm.episodes import episode_rollout


def _steps(**options: Any) -> list[dict[str, Any]]:
    (ep,) = to_episode_dicts([versioned_rollout()], **options)
    return ep["trajectories"][0]["steps"]


def test_steps_carry_their_oldest_version_and_the_exact_spans() -> None:
    (ep,) = to_episode_dicts([versioned_rollout()])
    assert ep["info"]["rollwire"]["weight_versions"] == ["1", "2", "3"]
    steps = ep["trajectories"][0]["steps"]
    # call 1 sampled 2 tokens with v1 then 3 with v2: rLLM's staleness check sees v1
    assert [s["weight_version"] for s in steps] == [1, 1, 2]
    assert [s["model_output"]["weight_version"] for s in steps] == [1, 1, 2]
    assert [s["info"]["rollwire"]["weight_versions"] for s in steps] == [
        [["1", 0, 4]],
        [["1", 0, 2], ["2", 2, 5]],
        [["2", 0, 1], ["3", 1, 3]],
    ]
    assert [s["info"]["rollwire"]["policy_version"] for s in steps] == ["1", "2", "3"]


def test_episode_round_trip_keeps_the_spans() -> None:
    (ep,) = to_episode_dicts([versioned_rollout()])
    back = episode_rollout(ep)
    assert [c.version_spans() for c in back.calls] == [
        c.version_spans() for c in versioned_rollout().calls
    ]
    assert back.weight_versions() == ["1", "2", "3"]


def test_step_credit_sets_reward_return_and_per_token_advantage() -> None:
    steps = _steps(step_credit=StepCredit("discounted", 0.9))
    assert [s["reward"] for s in steps] == [0.25, 0.5, 1.0]
    # rLLM's compute_mc_return: G_t = r_t + gamma * G_{t+1}
    np.testing.assert_allclose([s["mc_return"] for s in steps], [1.51, 1.4, 1.0], rtol=1e-6)
    for s, g in zip(steps, (1.51, 1.4, 1.0)):
        assert len(s["advantage"]) == len(s["response_ids"])
        np.testing.assert_allclose(s["advantage"], [g] * len(s["response_ids"]), rtol=1e-6)
    steps = _steps(step_credit="broadcast")
    assert [s["advantage"][0] for s in steps] == [0.25, 0.5, 1.0]
    # mc_return is the return with the credit's gamma whatever the mode: 1.75, 1.5, 1.0
    np.testing.assert_allclose([s["mc_return"] for s in steps], [1.75, 1.5, 1.0])


def test_without_step_rewards_or_credit_episodes_are_as_before() -> None:
    plain = to_episode_dicts(sample_batch())
    credited = to_episode_dicts(sample_batch(), step_credit="discounted")
    for a, b in zip(plain, credited):
        assert a["trajectories"] == b["trajectories"]
    steps = _steps()  # step rewards, but no credit asked: today's last-step reward
    assert [s["reward"] for s in steps] == [0.0, 0.0, 1.0]
    assert [s["advantage"] for s in steps] == [None, None, None]
    (ep,) = to_episode_dicts([merged_rollout()])
    assert [s["info"]["rollwire"]["weight_versions"] for s in ep["trajectories"][0]["steps"]] == [
        [],
        [],
        [],
    ]
