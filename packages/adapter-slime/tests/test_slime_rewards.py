"""``normalize_rewards``: slime's reward post-process hook, counting rollouts rather than rows."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rollwire.testing import sample_batch
from rollwire_slime import normalize_rewards, to_sample_dicts


def _args(**kw: Any) -> SimpleNamespace:
    base = {
        "advantage_estimator": "grpo",
        "rewards_normalization": True,
        "grpo_std_normalization": True,
        "n_samples_per_prompt": 3,
        "reward_key": None,
    }
    base.update(kw)
    return SimpleNamespace(**base)


def _s(group: int, rollout: int, reward: Any, **kw: Any) -> SimpleNamespace:
    return SimpleNamespace(
        group_index=group,
        rollout_id=rollout,
        index=rollout,
        reward=reward,
        remove_sample=kw.pop("remove_sample", False),
        metadata={},
        **kw,
    )


def _grpo(values: list[float]) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    std = arr.std(ddof=1) if arr.size > 1 else 0.0
    return (arr - arr.mean()) / (std + 1e-6) if std > 0 else np.zeros_like(arr)


def test_uneven_groups_are_normalised_each_on_its_own() -> None:
    # 3 + 2 samples: slime's default would see 5 != 2 x 3 and pool the whole batch
    samples = [_s(0, 0, 1.0), _s(0, 1, 0.0), _s(0, 2, 0.5), _s(1, 3, 2.0), _s(1, 4, 4.0)]
    raw, adv = normalize_rewards(_args(), samples)
    assert raw == [1.0, 0.0, 0.5, 2.0, 4.0]
    np.testing.assert_allclose(adv[:3], _grpo([1.0, 0.0, 0.5]), atol=1e-5)
    np.testing.assert_allclose(adv[3:], _grpo([2.0, 4.0]), atol=1e-5)


def test_forked_rollout_counts_once() -> None:
    # rollout 0 forked into 3 rows; its group has rollouts with rewards 1, 0, 0
    samples = [_s(0, 0, 1.0), _s(0, 0, 1.0), _s(0, 0, 1.0), _s(0, 1, 0.0), _s(0, 2, 0.0)]
    _, adv = normalize_rewards(_args(), samples)
    expected = _grpo([1.0, 0.0, 0.0])
    np.testing.assert_allclose(adv, [expected[0]] * 3 + [expected[1], expected[2]], atol=1e-5)
    # counted per row, the forked rollout would have pulled the mean to 0.6
    assert adv[3] == pytest.approx(expected[1], abs=1e-5)


def test_zero_variance_group_gets_zero() -> None:
    samples = [_s(0, 0, 1.0), _s(0, 1, 1.0), _s(1, 2, 0.0), _s(1, 3, 1.0)]
    _, adv = normalize_rewards(_args(), samples)
    assert adv[:2] == [0.0, 0.0]
    assert adv[2] < 0 < adv[3]


def test_single_rollout_group_gets_zero() -> None:
    _, adv = normalize_rewards(_args(), [_s(0, 0, 3.0), _s(0, 0, 3.0)])
    assert adv == [0.0, 0.0]


def test_centre_only_and_passthrough() -> None:
    samples = [_s(0, 0, 1.0), _s(0, 1, 3.0)]
    _, adv = normalize_rewards(_args(advantage_estimator="reinforce_plus_plus_baseline"), samples)
    assert adv == pytest.approx([-1.0, 1.0])
    _, adv = normalize_rewards(_args(grpo_std_normalization=False), samples)
    assert adv == pytest.approx([-1.0, 1.0])
    raw, adv = normalize_rewards(_args(advantage_estimator="ppo"), samples)
    assert raw == adv == [1.0, 3.0]
    _, adv = normalize_rewards(_args(rewards_normalization=False), samples)
    assert adv == [1.0, 3.0]


def test_removed_samples_stay_out_of_the_statistics() -> None:
    samples = [_s(0, 0, 1.0), _s(0, 1, 0.0), _s(0, 2, 100.0, remove_sample=True)]
    _, adv = normalize_rewards(_args(), samples)
    np.testing.assert_allclose(adv[:2], _grpo([1.0, 0.0]), atol=1e-5)
    assert adv[2] == 0.0


def test_reward_key_and_bad_rewards() -> None:
    samples = [_s(0, 0, {"acc": 1.0}), _s(0, 1, {"acc": 0.0})]
    raw, _ = normalize_rewards(_args(reward_key="acc"), samples)
    assert raw == [1.0, 0.0]
    with pytest.raises(ValueError, match="reward-key"):
        normalize_rewards(_args(), samples)
    with pytest.raises(ValueError, match="needs a number"):
        normalize_rewards(_args(), [_s(0, 0, None)])


def test_on_converted_batch_dicts() -> None:
    flat = [s for g in to_sample_dicts(sample_batch()) for s in g]
    raw, adv = normalize_rewards(_args(), flat)
    assert len(raw) == len(adv) == 7
    # group 0: rollouts a0=1.0, a1=0.5, a2=-0.5 (a2 has two rows, counted once)
    expected = _grpo([1.0, 0.5, -0.5])
    np.testing.assert_allclose(adv[:4], [*expected, expected[2]], atol=1e-5)
