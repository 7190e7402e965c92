"""The TRL adapter's conversion: the shared conformance suite, and what ``rollout_func`` needs
(one sample per rollout) for forked, failed and model-less rollouts. No torch, no TRL."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import orjson
import pytest

import rollwire_trl
from rollwire.data.protocol import Group, Rollout
from rollwire.data.trajectory import build_rows
from rollwire.testing import (
    TrainerAdapterConformance,
    TrainerLoopConformance,
    failed_rollout,
    forked_rollout,
    merged_rollout,
    sample_batch,
    side_call_rollout,
    single_turn_rollout,
)
from rollwire_trl import to_rollout_output


class TestTrlLoopConformance(TrainerLoopConformance):
    @pytest.fixture
    def adapter(self) -> Any:
        return rollwire_trl.adapter


class TestTrlConformance(TrainerAdapterConformance):
    # TRL's GRPOTrainer has no router replay: a rollout_func sample carries no routing.
    exports_routed_experts = False

    @pytest.fixture
    def adapter(self) -> Any:
        return rollwire_trl.adapter


def test_import_does_not_load_torch_or_trl() -> None:
    code = (
        "import sys, rollwire_trl\n"
        "heavy = [m for m in ('torch', 'trl', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert rollwire_trl.adapter.name == 'trl'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plugin_loader_finds_the_adapter() -> None:
    from rollwire.plugins import discover

    info = {(p.kind, p.name): p for p in discover()}[("trainers", "trl")]
    assert info.distribution == "rollwire-trl"
    assert info.status == "ok"  # converting needs no TRL
    try:
        import trl  # noqa: F401
    except ImportError:  # the workspace venv: it exports the dict form, and says so
        assert info.export_only and "trl is not installed" in info.detail
    else:
        assert not info.export_only


def test_last_mode_gives_one_sample_per_rollout_in_order() -> None:
    batch = sample_batch()
    out, report = to_rollout_output(batch, multi_row="last", return_report=True)
    ids = [r.rollout_id for g in batch for r in g.rollouts]
    assert out["rollwire_rollout_id"] == ids
    assert report.rollouts == report.samples == len(ids)
    for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "rollwire_reward"):
        assert len(out[key]) == len(ids), key
    for c, lp, m in zip(out["completion_ids"], out["logprobs"], out["env_mask"]):
        assert len(c) == len(lp) == len(m)


def test_forked_rollout_trains_on_its_last_row_and_counts_the_rest() -> None:
    rollout = forked_rollout("f", "g")
    rows = build_rows([rollout])
    assert len(rows) == 2
    out, report = to_rollout_output([rollout], multi_row="last", return_report=True)
    np.testing.assert_array_equal(out["prompt_ids"][0], rows[1].prompt_ids)
    np.testing.assert_array_equal(out["completion_ids"][0], rows[1].response_ids)
    np.testing.assert_array_equal(out["env_mask"][0], rows[1].loss_mask)
    assert report.forked == 1
    assert report.forked_tokens_dropped == int(rows[0].loss_mask.sum()) > 0
    assert out["rollwire_reward"] == [rollout.reward]


def test_a_side_call_mid_rollout_is_not_taken_for_the_final_answer() -> None:
    # rows are in the order they were opened: the side call's row comes after the main one,
    # but the final answer continues the main conversation
    rollout = side_call_rollout("s", "g")
    rows = build_rows([rollout])
    assert len(rows) == 2 and rollout.calls[2].call_id in rows[0].call_ids
    out, report = to_rollout_output([rollout], multi_row="last", return_report=True)
    np.testing.assert_array_equal(out["completion_ids"][0], rows[0].response_ids)
    assert report.forked_tokens_dropped == 1  # the side call's one token


def test_multi_turn_row_masks_the_observations_between_calls() -> None:
    rollout = merged_rollout("m", "g")
    (row,) = build_rows([rollout])
    out = to_rollout_output([rollout], multi_row="last")
    mask = np.asarray(out["env_mask"][0])
    np.testing.assert_array_equal(mask, row.loss_mask)
    sampled = sum(c.completion_ids.shape[0] for c in rollout.calls)
    assert mask.sum() == sampled and 0 < sampled < mask.size  # context tokens are in, masked
    lp = np.asarray(out["logprobs"][0])
    np.testing.assert_allclose(lp[mask == 1], np.concatenate([c.logprobs for c in rollout.calls]))
    assert np.all(lp[mask == 0] == 0.0)


def test_failed_rollout_keeps_its_tokens_masked_with_the_failure_reward() -> None:
    out, report = to_rollout_output(
        [failed_rollout("x", "g")], multi_row="last", failure_reward=-1.0, return_report=True
    )
    assert report.failed == 1
    assert out["rollwire_reward"] == [-1.0]
    assert out["env_mask"][0] and not any(out["env_mask"][0])
    assert out["rollwire_trainable"] == [False]


def test_rollout_without_a_usable_call_is_an_unscored_placeholder() -> None:
    broken = failed_rollout("x", "g")
    broken.calls[0].status = "failed"
    silent = Rollout(rollout_id="s", group_id="g", status="completed", reward=1.0)
    out, report = to_rollout_output(
        [broken, silent],
        multi_row="last",
        end_token_id=2,
        fallback_prompt_ids=lambda r: [7, 8, 9] if r.rollout_id == "s" else [],
        return_report=True,
    )
    assert report.placeholders == 2
    # no decision of the policy earned these rewards: None keeps them out of the group baseline
    assert out["rollwire_reward"] == [None, None]
    assert out["prompt_ids"] == [[2], [7, 8, 9]]
    assert out["completion_ids"] == [[2], [2]]
    assert out["env_mask"] == [[0], [0]]


def test_export_writes_one_json_sample_per_line(tmp_path: Any) -> None:
    batch = [
        Group(group_id="g", rollouts=[single_turn_rollout("a", "g"), merged_rollout("b", "g")])
    ]
    path = rollwire_trl.adapter.export(batch, tmp_path / "batch.jsonl")
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [line["rollwire_rollout_id"] for line in lines] == ["a", "b"]
    assert set(lines[0]) >= {"prompt_ids", "completion_ids", "logprobs", "env_mask"}


def test_unknown_multi_row_is_refused() -> None:
    with pytest.raises(ValueError, match="multi_row"):
        to_rollout_output(sample_batch(), multi_row="first")  # type: ignore[arg-type]
