"""Step-level credit: per-turn rewards as per-token advantages, checked against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from rollwire.data.credit import StepCredit, step_values
from rollwire.data.protocol import Rollout
from rollwire.data.rewards import attach_step_rewards
from rollwire.data.trajectory import TrajectoryBuilder, build_rows
from rollwire.testing.samples import forked_rollout, merged_rollout, versioned_rollout

# versioned_rollout: one row; response = c0 (4) | ctx (3) | c1 (5) | ctx (2) | c2 (3); steps
# r = 0.25, 0.5, 1.0
_C0, _CTX1, _C1, _CTX2, _C2 = 4, 3, 5, 2, 3


def _expected(v0: float, v1: float, v2: float) -> np.ndarray:
    return np.asarray(
        [v0] * _C0 + [0.0] * _CTX1 + [v1] * _C1 + [0.0] * _CTX2 + [v2] * _C2, np.float32
    )


def test_broadcast_gives_each_turn_its_own_reward() -> None:
    (row,) = build_rows([versioned_rollout()], credit="broadcast")
    assert row.advantages is not None
    np.testing.assert_allclose(row.advantages, _expected(0.25, 0.5, 1.0))


def test_discounted_return_by_hand() -> None:
    # G2 = 1.0; G1 = 0.5 + 0.9 * 1.0 = 1.4; G0 = 0.25 + 0.9 * 1.4 = 1.51
    (row,) = build_rows([versioned_rollout()], credit=StepCredit("discounted", gamma=0.9))
    assert row.advantages is not None
    np.testing.assert_allclose(row.advantages, _expected(1.51, 1.4, 1.0), rtol=1e-6)
    # gamma 1: the undiscounted return to go 1.75, 1.5, 1.0
    (row,) = build_rows([versioned_rollout()], credit="discounted")
    np.testing.assert_allclose(row.advantages, _expected(1.75, 1.5, 1.0))  # type: ignore[arg-type]


def test_token_level_step_rewards_sit_on_each_turns_last_sampled_token() -> None:
    for credit in ("broadcast", StepCredit("discounted", 0.9)):
        (row,) = build_rows([versioned_rollout()], credit=credit)  # type: ignore[arg-type]
        expected = np.zeros(17, np.float32)
        expected[[3, 11, 16]] = [0.25, 0.5, 1.0]  # the step rewards, whatever the mode
        np.testing.assert_array_equal(row.step_rewards, expected)  # type: ignore[arg-type]


def test_without_step_rewards_rows_are_exactly_as_before() -> None:
    plain = build_rows([merged_rollout(), forked_rollout()])
    for mode in ("broadcast", "discounted"):
        credited = build_rows([merged_rollout(), forked_rollout()], credit=mode)  # type: ignore[arg-type]
        assert [r.advantages for r in credited] == [None] * len(plain)
        assert [r.step_rewards for r in credited] == [None] * len(plain)
        for a, b in zip(plain, credited):
            assert a.model_dump(mode="json") == b.model_dump(mode="json")


def test_without_credit_asked_step_rewards_change_nothing() -> None:
    (row,) = build_rows([versioned_rollout()])
    assert row.advantages is None


def test_masked_calls_get_no_credit_and_turns_skip_them() -> None:
    rollout = versioned_rollout()
    rollout.calls[1].trainable = False  # e.g. an eval or superseded call: context only
    rollout.calls[1].step_reward = None
    (row,) = build_rows([rollout], credit="discounted")
    assert row.advantages is not None
    # turns are c0 and c2 only: G(c2) = 1.0, G(c0) = 0.25 + 1.0
    np.testing.assert_allclose(row.advantages, _expected(1.25, 0.0, 1.0))


def test_discounting_runs_across_the_rows_of_a_forked_rollout() -> None:
    rollout = versioned_rollout()
    p2 = rollout.calls[2].prompt_ids.copy()
    p2[9] = 4242
    rollout.calls[2] = rollout.calls[2].model_copy(update={"prompt_ids": p2})
    first, second = TrajectoryBuilder(credit=StepCredit("discounted", 0.5)).build(rollout)
    # G2 = 1.0; G1 = 0.5 + 0.5 = 1.0; G0 = 0.25 + 0.5 = 0.75
    assert first.advantages is not None and second.advantages is not None
    np.testing.assert_allclose(first.advantages, [0.75] * 4 + [0.0] * 3 + [1.0] * 5)
    np.testing.assert_allclose(second.advantages, [1.0] * 3)


def test_a_turn_past_the_list_counts_zero() -> None:
    rollout = Rollout.model_validate(merged_rollout().model_dump())
    rollout.metrics = {"step_reward/0": 2.0}  # one element for three turns
    rollout = attach_step_rewards(rollout)
    values = step_values(rollout, StepCredit("discounted", 0.5))
    assert values == {"r-merged-c0": 2.0, "r-merged-c1": 0.0, "r-merged-c2": 0.0}
    assert step_values(rollout, StepCredit("broadcast")) == values


def test_bad_settings_and_rewards_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown step credit mode 'gae'"):
        StepCredit("gae")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gamma must be in"):
        StepCredit("discounted", gamma=1.5)
    rollout = versioned_rollout()
    rollout.calls[1].step_reward = float("nan")
    with pytest.raises(ValueError, match="step reward nan"):
        build_rows([rollout], credit="broadcast")
