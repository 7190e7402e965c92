"""Tinker datums against the rows they came from, field by field, and against the SDK's own types."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tinker import types

import rollwire_tinker
from rollwire.data.protocol import Group
from rollwire.data.trajectory import build_rows
from rollwire.testing import (
    TrainerAdapterConformance,
    TrainerLoopConformance,
    merged_rollout,
    sample_batch,
    single_turn_rollout,
)
from rollwire_tinker import TinkerDatum, group_advantages, ratio_stats, row_datum, to_datums


class TestTinkerConformance(TrainerAdapterConformance):
    #: a datum has tokens, log-probs and advantages only: MoE routing cannot travel in it
    exports_routed_experts = False

    @pytest.fixture
    def adapter(self) -> Any:
        return rollwire_tinker.adapter


class TestTinkerLoopConformance(TrainerLoopConformance):
    @pytest.fixture
    def adapter(self) -> Any:
        return rollwire_tinker.adapter


def test_each_datum_field_from_its_row() -> None:
    batch = sample_batch()
    built = to_datums(batch)
    rows = {(r.rollout_id, r.row_index): r for r in build_rows(batch)}
    assert len(built.datums) == len(rows) - 1  # b2 failed: its row trains nothing
    for datum in built.datums:
        row = rows[(datum.rollout_id, datum.row_index)]
        ids, p = row.input_ids, row.prompt_len
        np.testing.assert_array_equal(datum.model_input, ids[:-1])
        np.testing.assert_array_equal(datum.target_tokens, ids[1:])
        assert datum.model_input.dtype == datum.target_tokens.dtype == np.int64
        assert datum.logprobs.dtype == datum.advantages.dtype == np.float32
        # positions before p - 1 predict prompt tokens: no log-prob, no advantage
        assert not datum.logprobs[: p - 1].any() and not datum.advantages[: p - 1].any()
        mask = row.loss_mask == 1
        np.testing.assert_array_equal(datum.logprobs[p - 1 :][mask], row.logprobs[mask])
        assert not datum.logprobs[p - 1 :][~mask].any()
        adv = built.advantages[row.rollout_id]
        np.testing.assert_allclose(datum.advantages[p - 1 :][mask], adv, rtol=1e-6)
        assert not datum.advantages[p - 1 :][~mask].any(), "tool/context tokens are trained"
        np.testing.assert_array_equal(datum.trained()[p - 1 :], mask)
        assert datum.reward == row.reward and datum.group_id == row.group_id
    assert built.skipped == {"b2": "status failed"}


def test_merged_rollout_masks_the_tool_tokens() -> None:
    (row,) = build_rows([merged_rollout("m", "g")])
    datum = row_datum(row, 0.25)
    # 8 prompt + 4 sampled + 3 tool + 5 sampled + 2 tool + 3 sampled
    trained = datum.advantages[row.prompt_len - 1 :] != 0
    assert trained.tolist() == [True] * 4 + [False] * 3 + [True] * 5 + [False] * 2 + [True] * 3
    assert datum.advantages.shape == (row.input_ids.shape[0] - 1,)


def test_grpo_advantages_within_each_group() -> None:
    adv = group_advantages(
        {"a": 1.0, "b": 0.0, "c": 0.5, "x": 3.0},
        {"a": "g", "b": "g", "c": "g", "x": None},
        scale=False,
    )
    assert adv == pytest.approx({"a": 0.5, "b": -0.5, "c": 0.0, "x": 0.0})
    # scaled by the group's sample standard deviation (TRL's GRPO), the loop's default
    scaled = group_advantages({"a": 1.0, "b": 0.0}, {"a": "g", "b": "g"}, scale=True)
    assert scaled["a"] == pytest.approx(0.5 / np.std([1.0, 0.0], ddof=1), rel=1e-3)
    assert scaled["b"] == pytest.approx(-scaled["a"])


def test_token_advantages_override_and_bad_lengths_are_refused() -> None:
    (row,) = build_rows([single_turn_rollout("s", "g")])
    per_token = np.array([1.0, 2.0, 3.0, 4.0, 5.0], dtype=np.float32)
    built = to_datums([single_turn_rollout("s", "g")], token_advantages={("s", 0): per_token})
    np.testing.assert_array_equal(built.datums[0].advantages[row.prompt_len - 1 :], per_token)
    with pytest.raises(ValueError, match=r"\(3,\) advantages for 5 response tokens"):
        row_datum(row, np.ones(3))


def test_empty_prompt_leaves_the_first_token_out() -> None:
    (row,) = build_rows([single_turn_rollout("s", "g")])
    row = row.model_copy(update={"input_ids": row.input_ids[10:], "prompt_len": 0})
    datum = row_datum(row, 1.0)
    assert datum.advantages.tolist() == [1.0] * 4
    np.testing.assert_array_equal(datum.logprobs, row.logprobs[1:])


def test_sdk_datum_is_the_wire_form() -> None:
    datum = to_datums(sample_batch()).datums[1]
    sdk = datum.to_sdk()
    assert isinstance(sdk, types.Datum)
    assert sdk.model_input.to_ints() == datum.model_input.tolist()
    assert sdk.model_dump(mode="json", exclude_none=True) == datum.to_wire()
    for name, array in datum.loss_fn_inputs().items():
        np.testing.assert_array_equal(sdk.loss_fn_inputs[name].to_numpy(), array)


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo"])
def test_forward_backward_request_validates_in_the_sdk(loss_fn: str) -> None:
    datums = [d.to_sdk() for d in to_datums(sample_batch()).datums]
    config = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2} if loss_fn == "ppo" else None
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=datums, loss_fn=loss_fn, loss_fn_config=config
        ),
        model_id="m",
        seq_id=1,
    )
    body = json.loads(request.model_dump_json(exclude_none=True))
    assert body["forward_backward_input"]["loss_fn"] == loss_fn
    assert len(body["forward_backward_input"]["data"]) == len(datums)
    first = body["forward_backward_input"]["data"][0]["loss_fn_inputs"]
    assert set(first) == {"target_tokens", "logprobs", "advantages"}


def test_ratio_stats_compare_trainer_and_behaviour_logprobs() -> None:
    datums = to_datums(sample_batch()).datums
    same = ratio_stats(datums, [d.logprobs for d in datums], "ppo", (0.8, 1.2))
    assert same["is_ratio_mean"] == pytest.approx(1.0)
    assert same["kl_behaviour"] == pytest.approx(0.0) and same["clip_ratio"] == 0.0
    shifted = ratio_stats(datums, [d.logprobs + 0.5 for d in datums], "ppo", (0.8, 1.2))
    assert shifted["is_ratio_min"] == pytest.approx(np.exp(0.5), rel=1e-5)
    # k3, as every trainer's: exp(d) - d - 1 with d = trainer - behaviour
    assert shifted["clip_ratio"] == 1.0
    assert shifted["kl_behaviour"] == pytest.approx(np.exp(0.5) - 1.5, rel=1e-5)


def test_export_round_trips_through_flatten(tmp_path: Path) -> None:
    adapter = rollwire_tinker.adapter
    path = adapter.export(sample_batch(), tmp_path / "b.tinker.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    direct = adapter.flatten(adapter.convert(sample_batch()))
    again = adapter.flatten(lines)
    assert [r.rollout_id for r in again] == [r.rollout_id for r in direct]
    for a, b in zip(again, direct):
        np.testing.assert_array_equal(a.response_ids, b.response_ids)
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-6)
    assert types.Datum.model_validate(lines[0]["datum"])


def test_no_completed_rollout_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no rollouts"):
        to_datums([Group(group_id="g", rollouts=[])])
    failed_only = to_datums([sample_batch()[1].rollouts[2]])
    assert failed_only.datums == [] and failed_only.skipped == {"b2": "status failed"}
    assert all(isinstance(d, TinkerDatum) for d in to_datums(sample_batch()).datums)
