"""Weight versions and step credit in verl's DataProto and agent-loop outputs (issues 23.4,
25.2, 25.5), hand-computed."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from verl import DataProto  # noqa: E402

from rollwire.data.credit import StepCredit  # noqa: E402
from rollwire.data.protocol import Group  # noqa: E402
from rollwire.data.trajectory import TrajectoryBuilder  # noqa: E402
from rollwire.testing import merged_rollout, sample_batch  # noqa: E402
from rollwire.testing.samples import versioned_rollout  # noqa: E402
from rollwire_verl import step_advantages, to_dataproto  # noqa: E402
from rollwire_verl.outputs import rows_to_agent_loop_outputs  # noqa: E402

# versioned_rollout: 8 prompt tokens; response c0 (4) | ctx (3) | c1 (5) | ctx (2) | c2 (3)
_RESPONSE = 17


def _batch() -> list[Group]:
    return [*sample_batch(), Group(group_id="g2", rollouts=[versioned_rollout("v0")])]


def _row_of(data: DataProto, rollout_id: str) -> int:
    (i,) = np.flatnonzero(data.non_tensor_batch["rollout_id"] == rollout_id)
    return int(i)


def test_rows_list_their_versions_and_spans_over_the_response_columns() -> None:
    data = to_dataproto(_batch())
    i = _row_of(data, "v0")
    assert data.non_tensor_batch["weight_versions"][i] == ["1", "2", "3"]
    spans = data.non_tensor_batch["weight_version_spans"][i]
    assert spans == [["1", 0, 4], ["1", 7, 9], ["2", 9, 12], ["2", 14, 15], ["3", 15, 17]]
    # the spans index responses[i]; every trained column lies in one
    trained = np.flatnonzero(data.batch["response_mask"][i].numpy())
    covered = {c for _, s, e in spans for c in range(s, e)}
    assert set(trained.tolist()) <= covered
    j = _row_of(data, "a0")  # a rollout without versions
    assert data.non_tensor_batch["weight_versions"][j] == []
    assert "weight_versions" not in data.meta_info["reward_extra_keys"]


def test_cut_rows_keep_only_the_spans_of_kept_tokens() -> None:
    data = to_dataproto(_batch(), max_response_length=10)
    spans = data.non_tensor_batch["weight_version_spans"][_row_of(data, "v0")]
    assert spans == [["1", 0, 4], ["1", 7, 9], ["2", 9, 10]]


def test_step_advantages_and_step_rewards_by_hand() -> None:
    data = to_dataproto(_batch(), step_credit=StepCredit("discounted", 0.9))
    i = _row_of(data, "v0")
    adv = data.batch["step_advantages"][i].numpy()
    expected = [1.51] * 4 + [0.0] * 3 + [1.4] * 5 + [0.0] * 2 + [1.0] * 3
    np.testing.assert_allclose(adv[:_RESPONSE], expected, rtol=1e-6)
    assert (adv[_RESPONSE:] == 0).all()
    rewards = data.batch["step_rewards"][i].numpy()
    want = np.zeros_like(rewards)
    want[[3, 11, 16]] = [0.25, 0.5, 1.0]
    np.testing.assert_array_equal(rewards, want)
    has = data.non_tensor_batch["has_step_credit"]
    assert has[i] and has.sum() == 1  # the other rollouts have no step rewards: zeros
    other = [k for k in range(len(data)) if k != i]
    assert (data.batch["step_advantages"][other] == 0).all()
    # outcome rewards are untouched: rm_scores still carries the rollout reward at the end
    assert float(data.batch["rm_scores"][i].sum()) == pytest.approx(1.0)


def test_step_advantages_helper_stores_masked_advantages() -> None:
    data = to_dataproto(_batch(), step_credit="broadcast")
    adv, ret = step_advantages(data)
    mask = data.batch["response_mask"].to(torch.float32)
    assert torch.equal(adv, data.batch["step_advantages"] * mask)
    assert torch.equal(data.batch["advantages"], adv) and torch.equal(data.batch["returns"], ret)
    with pytest.raises(ValueError, match="no batch\\['step_advantages'\\]"):
        step_advantages(to_dataproto(sample_batch()))


def test_no_step_rewards_means_the_same_batch_as_before() -> None:
    plain = to_dataproto(sample_batch())
    credited = to_dataproto(sample_batch(), step_credit="discounted")
    assert set(plain.batch.keys()) == set(credited.batch.keys())
    for key in sorted(plain.batch.keys()):
        assert torch.equal(plain.batch[key], credited.batch[key]), key
    assert set(plain.non_tensor_batch) == set(credited.non_tensor_batch)
    assert "step_advantages" not in plain.batch


def test_batches_with_versions_and_credit_still_concatenate() -> None:
    a = to_dataproto(_batch(), step_credit="broadcast", max_response_length=20)
    b = to_dataproto(_batch(), step_credit="broadcast", max_response_length=20)
    both = DataProto.concat([a, b])
    assert len(both) == len(a) + len(b)
    assert list(both.non_tensor_batch["weight_versions"][: len(a)]) == list(
        a.non_tensor_batch["weight_versions"]
    )


def test_agent_loop_outputs_take_min_and_max_from_the_token_versions() -> None:
    rollout = versioned_rollout()
    rows = TrajectoryBuilder().build(rollout)
    out = rows_to_agent_loop_outputs(rollout, rows)
    assert out.extra_fields["min_global_steps"] == 1  # call 1's first tokens were version 1
    assert out.extra_fields["max_global_steps"] == 3
    assert out.extra_fields["weight_versions"] == ["1", "2", "3"]
    plain = merged_rollout()
    out = rows_to_agent_loop_outputs(plain, TrajectoryBuilder().build(plain), global_steps=4)
    assert out.extra_fields["min_global_steps"] == out.extra_fields["max_global_steps"] == 3


def test_agent_loop_outputs_carry_the_step_credit_per_token() -> None:
    rollout = versioned_rollout()
    rows = TrajectoryBuilder(credit="broadcast").build(rollout)
    out = rows_to_agent_loop_outputs(rollout, rows)
    adv = out.extra_fields["rollwire_step_advantages"]
    assert adv == pytest.approx([0.25] * 4 + [0.0] * 3 + [0.5] * 5 + [0.0] * 2 + [1.0] * 3)
    assert len(adv) == len(out.response_ids) == len(out.response_mask)
    rewards = out.extra_fields["rollwire_step_rewards"]
    assert [i for i, r in enumerate(rewards) if r] == [3, 11, 16]
    plain = rows_to_agent_loop_outputs(rollout, TrajectoryBuilder().build(rollout))
    assert "rollwire_step_advantages" not in plain.extra_fields


def test_loop_settings_read_and_check_the_step_credit() -> None:
    from rollwire_verl.settings import LoopSettings

    assert LoopSettings.from_options({"step_credit": "discounted:0.9"}).step_credit == (
        "discounted:0.9"
    )
    with pytest.raises(ValueError, match="unknown step credit mode 'gae'"):
        LoopSettings.from_options({"step_credit": "gae"}).validate()
