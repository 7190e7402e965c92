"""Weight versions and step credit in slime samples (issues 23.4, 25.2, 25.5), hand-computed."""

from __future__ import annotations

import json
import types
from typing import Any

import numpy as np
import pytest

from rollwire.data.credit import StepCredit
from rollwire.data.protocol import Group
from rollwire.testing import merged_rollout, sample_batch
from rollwire.testing.samples import versioned_rollout
from rollwire_slime import normalize_rewards, to_sample_dicts, to_samples
from rollwire_slime.hooks import HookConfig


def _versioned_batch() -> list[Group]:
    return [*sample_batch(), Group(group_id="g2", rollouts=[versioned_rollout()])]


def _samples_of(batch: list[Group], rid: str, **options: Any) -> list[dict[str, Any]]:
    return [
        s
        for g in to_sample_dicts(batch, **options)
        for s in g
        if s["metadata"]["rollwire"]["rollout_id"] == rid
    ]


def test_weight_versions_list_each_calls_spans_and_the_meta_keeps_them_exact() -> None:
    (s,) = _samples_of(_versioned_batch(), "r-versioned")
    # one entry per generation as slime appends them: c0 (1), c1 (1 then 2), c2 (2 then 3)
    assert s["weight_versions"] == ["1", "1", "2", "2", "3"]
    meta = s["metadata"]["rollwire"]
    assert meta["weight_versions"] == ["1", "2", "3"]
    assert meta["rollout_weight_versions"] == ["1", "2", "3"]
    assert meta["weight_version_spans"] == [
        ["1", 0, 4],
        ["1", 7, 9],
        ["2", 9, 12],
        ["2", 14, 15],
        ["3", 15, 17],
    ]
    assert all(end <= s["response_length"] for _, _, end in meta["weight_version_spans"])
    json.dumps(s)


def test_unlabelled_calls_keep_their_policy_version_per_call() -> None:
    rollout = merged_rollout()
    for i, call in enumerate(rollout.calls):
        call.policy_version = str(7 + i)
    ((s,),) = to_sample_dicts([rollout])
    assert s["weight_versions"] == ["7", "8", "9"]
    assert s["metadata"]["rollwire"]["weight_versions"] == ["7", "8", "9"]
    ((s,),) = to_sample_dicts([merged_rollout()])
    assert s["weight_versions"] == []
    assert s["metadata"]["rollwire"]["weight_version_spans"] == []


def test_per_call_samples_carry_each_steps_credit_as_their_reward() -> None:
    rows = _samples_of(
        _versioned_batch(),
        "r-versioned",
        mode="per_call",
        step_credit=StepCredit("discounted", 0.9),
    )
    # G0 = 0.25 + 0.9 * (0.5 + 0.9 * 1.0) = 1.51, G1 = 1.4, G2 = 1.0
    np.testing.assert_allclose([s["reward"] for s in rows], [1.51, 1.4, 1.0], rtol=1e-6)
    for s, g in zip(rows, (1.51, 1.4, 1.0)):
        meta = s["metadata"]["rollwire"]
        assert meta["step_credit"] == "discounted" and meta["reward"] == 1.0
        np.testing.assert_allclose(meta["step_advantages"], [g] * s["response_length"], rtol=1e-6)
    rows = _samples_of(_versioned_batch(), "r-versioned", mode="per_call", step_credit="broadcast")
    assert [s["reward"] for s in rows] == [0.25, 0.5, 1.0]


def test_a_merged_row_gets_the_return_from_its_first_turn() -> None:
    (s,) = _samples_of(_versioned_batch(), "r-versioned", step_credit="discounted")
    assert s["reward"] == pytest.approx(1.75)  # 0.25 + 0.5 + 1.0
    adv = s["metadata"]["rollwire"]["step_advantages"]
    assert adv == pytest.approx([1.75] * 4 + [0.0] * 3 + [1.5] * 5 + [0.0] * 2 + [1.0] * 3)
    with pytest.raises(ValueError, match=r"merges 3 turns.*mode='per_call'"):
        to_sample_dicts(_versioned_batch(), step_credit="broadcast")


def test_without_step_rewards_or_credit_samples_are_as_before() -> None:
    plain = to_sample_dicts(sample_batch())
    assert to_sample_dicts(sample_batch(), step_credit="discounted") == plain
    assert all("step_credit" not in s["metadata"]["rollwire"] for g in plain for s in g)
    (s,) = _samples_of(_versioned_batch(), "r-versioned")  # step rewards, no credit asked
    assert s["reward"] == 1.0 and "step_advantages" not in s["metadata"]["rollwire"]


def test_normalize_rewards_counts_each_credited_step_once() -> None:
    batch = [Group(group_id="g", rollouts=[versioned_rollout("a"), versioned_rollout("b")])]
    batch[0].rollouts[1].calls[2].step_reward = 0.0  # b's last step scores 0
    (group,) = to_sample_dicts(batch, mode="per_call", step_credit="broadcast")
    args = types.SimpleNamespace(advantage_estimator="grpo", n_samples_per_prompt=2)
    raw, normalised = normalize_rewards(args, group)
    assert raw == [0.25, 0.5, 1.0, 0.25, 0.5, 0.0]
    mean, std = np.mean(raw), np.std(raw, ddof=1)  # six steps, six units
    np.testing.assert_allclose(normalised, (np.asarray(raw) - mean) / (std + 1e-6), rtol=1e-5)


def test_real_sample_objects_keep_the_fields(slime_types: types.ModuleType) -> None:
    samples = [s for g in to_samples(_versioned_batch(), step_credit="discounted") for s in g]
    (s,) = [x for x in samples if x.metadata["rollwire"]["rollout_id"] == "r-versioned"]
    assert isinstance(s, slime_types.Sample)
    assert s.weight_versions == ["1", "1", "2", "2", "3"] and s.reward == pytest.approx(1.75)


def test_hook_config_reads_the_step_credit_setting() -> None:
    args = types.SimpleNamespace(rollwire_step_credit="discounted:0.5")
    assert HookConfig.from_args(args, {}).step_credit == StepCredit("discounted", 0.5)
    assert HookConfig.from_args(types.SimpleNamespace(), {}).step_credit is None
    env = {"ROLLWIRE_STEP_CREDIT": "broadcast"}
    assert HookConfig.from_args(types.SimpleNamespace(), env).step_credit == StepCredit()
    with pytest.raises(ValueError, match="gamma 'x' is not a number"):
        HookConfig.from_args(types.SimpleNamespace(rollwire_step_credit="discounted:x"), {})
