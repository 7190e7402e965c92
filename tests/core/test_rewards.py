"""Rollout-level reward normalisation: forked rollouts count once in their group."""

from __future__ import annotations

import numpy as np
import pytest

from rollwire.data.rewards import group_advantages, normalize_row_rewards
from rollwire.testing.samples import sample_batch


def test_forked_rollout_counts_once() -> None:
    # group g: rollout a forked into 3 rows (reward 1), rollout b one row (reward 0)
    adv = normalize_row_rewards([1, 1, 1, 0], ["g"] * 4, ["a", "a", "a", "b"])
    # over rollouts: mean 0.5, unbiased std 0.7071 -> +-0.7071
    np.testing.assert_allclose(adv, [0.7071, 0.7071, 0.7071, -0.7071], atol=1e-3)
    row_level = (np.asarray([1, 1, 1, 0]) - 0.75) / np.std([1, 1, 1, 0], ddof=1)
    assert not np.allclose(adv, row_level)


def test_uneven_groups_and_zero_variance() -> None:
    adv = normalize_row_rewards(
        [2, 2, 1, 3, 5], ["x", "x", "y", "y", "y"], ["a", "b", "c", "d", "e"]
    )
    assert adv[0] == 0.0 and adv[1] == 0.0
    assert adv[2] < 0 < adv[4]
    np.testing.assert_allclose(adv[2:].mean(), 0.0, atol=1e-6)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="one entry per row"):
        normalize_row_rewards([1.0], ["g", "g"], ["a"])
    with pytest.raises(ValueError, match="not finite"):
        normalize_row_rewards([float("nan")], ["g"], ["a"])


def test_group_advantages_over_batch() -> None:
    adv = group_advantages(sample_batch(), failure_reward=-1.0)
    assert set(adv) == {"a0", "a1", "a2", "b0", "b1", "b2"}
    assert adv["a0"] > adv["a1"] > adv["a2"]
    assert sum(adv[k] for k in ("a0", "a1", "a2")) == pytest.approx(0.0, abs=1e-5)
    no_failed = group_advantages(sample_batch())
    assert "b2" not in no_failed


def test_rows_of_one_rollout_must_agree_on_the_reward() -> None:
    # the rollout reward goes on every row (DESIGN §6): disagreeing rows are a caller bug
    with pytest.raises(ValueError, match=r"rollout 'a'.*1\.0.*0\.5"):
        normalize_row_rewards([1.0, 0.5, 0.0], ["g"] * 3, ["a", "a", "b"])
