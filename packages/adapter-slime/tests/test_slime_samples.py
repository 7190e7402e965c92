"""slime sample dicts against DESIGN §9, field by field, on rollwire's hand-made rollouts."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rollwire_slime
from rollwire.data.protocol import Group, Rollout
from rollwire.data.trajectory import build_rows
from rollwire.testing import (
    TrainerAdapterConformance,
    failed_rollout,
    forked_rollout,
    merged_rollout,
    moe_rollout,
    sample_batch,
    single_turn_rollout,
)
from rollwire.testing.samples import LAYERS, TOP_K
from rollwire_slime import SAMPLE_FIELDS, to_sample_dicts
from rollwire_slime.samples import rollout_sample_dicts


class TestSlimeConformance(TrainerAdapterConformance):
    @pytest.fixture
    def adapter(self) -> Any:
        return rollwire_slime.adapter


def _one(rollout: Rollout) -> list[dict[str, Any]]:
    """The rows of a one-rollout batch."""
    (group,) = to_sample_dicts([rollout])
    return group


class _Tok:
    all_special_ids: Collection[int] = ()

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return " ".join(f"t{i}" for i in token_ids)


def _check_common(s: dict[str, Any]) -> None:
    assert set(s) == set(SAMPLE_FIELDS)
    for key in ("group_index", "index", "rollout_id", "response_length"):
        assert type(s[key]) is int, key
    n = s["response_length"]
    assert len(s["loss_mask"]) == len(s["rollout_log_probs"]) == n
    assert all(lp == 0.0 for lp, m in zip(s["rollout_log_probs"], s["loss_mask"]) if m == 0)
    assert s["status"] in ("completed", "truncated", "aborted", "failed")
    assert isinstance(s["metadata"]["rollwire"]["rollout_id"], str)
    json.dumps(s)  # the dict form is plain JSON


def test_single_turn() -> None:
    rollout = single_turn_rollout("r1", "g7", reward=1.0)
    rollout.task = {"prompt": "2+2?", "answer": "4"}
    (s,) = _one(rollout)
    _check_common(s)
    call = rollout.calls[0]
    assert s["tokens"] == call.full_tokens().tolist()
    assert s["response_length"] == 5
    assert s["loss_mask"] == [1] * 5
    np.testing.assert_allclose(s["rollout_log_probs"], call.logprobs, atol=1e-6)
    assert s["reward"] == 1.0 and s["label"] == "4"
    assert s["status"] == "completed"
    assert (s["group_index"], s["index"], s["rollout_id"]) == (0, 0, 0)
    assert s["session_id"] == "r1"
    assert s["prompt"] == call.request["messages"] and s["response"] == ""
    assert s["rollout_routed_experts"] is None
    assert s["remove_sample"] is False
    meta = s["metadata"]["rollwire"]
    assert meta["rollout_id"] == "r1" and meta["group_id"] == "g7" and meta["fork"] is None
    assert meta["metrics"] == {"turns": 1.0}


def test_text_with_tokenizer() -> None:
    (s,) = to_sample_dicts([single_turn_rollout()], tokenizer=_Tok())[0]
    assert s["prompt"] == " ".join(f"t{i}" for i in range(100, 110))
    assert s["response"] == " ".join(f"t{i}" for i in range(500, 505))


def test_merged_three_calls() -> None:
    rollout = merged_rollout("m", reward=0.5)
    (s,) = _one(rollout)
    _check_common(s)
    (row,) = build_rows([rollout])
    assert s["tokens"] == row.input_ids.tolist()
    assert len(s["tokens"]) - s["response_length"] == 8
    assert s["response_length"] == 17
    # completion 4, context 3, completion 5, context 2, completion 3
    assert s["loss_mask"] == [1] * 4 + [0] * 3 + [1] * 5 + [0] * 2 + [1] * 3
    sampled = np.concatenate([c.logprobs for c in rollout.calls])
    got = np.asarray(s["rollout_log_probs"])[np.asarray(s["loss_mask"]) == 1]
    np.testing.assert_allclose(got, sampled, atol=1e-6)
    assert s["metadata"]["rollwire"]["call_ids"] == ["m-c0", "m-c1", "m-c2"]


def test_forked_rows_share_rollout_id() -> None:
    rollout = forked_rollout("f", reward=-0.5)
    rows = _one(rollout)
    assert len(rows) == 2
    for s in rows:
        _check_common(s)
    assert rows[0]["rollout_id"] == rows[1]["rollout_id"] == 0
    assert rows[0]["index"] != rows[1]["index"]
    assert rows[0]["group_index"] == rows[1]["group_index"]
    assert rows[0]["reward"] == rows[1]["reward"] == -0.5
    fork = rows[1]["metadata"]["rollwire"]["fork"]
    assert fork["position"] == 9 and fork["call_id"] == "f-c2"
    assert rows[0]["metadata"]["rollwire"]["fork"] is None
    assert [r["metadata"]["rollwire"]["num_rows"] for r in rows] == [2, 2]


def test_failed_rollout() -> None:
    (s,) = _one(failed_rollout("x"))
    _check_common(s)
    assert s["status"] == "failed"
    assert s["reward"] == 0.0  # failure_reward stands in for the missing reward
    assert s["metadata"]["rollwire"]["error"] == "RuntimeError: tool crashed"
    assert s["metadata"]["rollwire"]["reward"] is None
    (t,) = to_sample_dicts([failed_rollout("x")], failure_reward=-1.0)[0]
    assert t["reward"] == -1.0


def test_moe_routed_experts_shape() -> None:
    rollout = moe_rollout("moe")
    (s,) = _one(rollout)
    _check_common(s)
    experts = np.asarray(s["rollout_routed_experts"])
    assert experts.shape == (len(s["tokens"]) - 1, LAYERS, TOP_K)
    np.testing.assert_array_equal(experts, rollout.calls[-1].routed_experts)


@pytest.mark.parametrize(
    ("status", "finish", "expected"),
    [
        ("completed", "stop", "completed"),
        ("completed", "length", "truncated"),
        ("timeout", "stop", "aborted"),
        ("cancelled", "stop", "aborted"),
        ("failed", "stop", "failed"),
    ],
)
def test_status(status: str, finish: str, expected: str) -> None:
    rollout = single_turn_rollout()
    rollout.status = status  # type: ignore[assignment]
    rollout.calls[0].finish_reason = finish
    (s,) = _one(rollout)
    assert s["status"] == expected


def test_weight_versions_one_per_call() -> None:
    rollout = merged_rollout()
    for i, call in enumerate(rollout.calls):
        call.policy_version = str(i + 3)
    (s,) = _one(rollout)
    assert s["weight_versions"] == ["3", "4", "5"]


def test_rollout_without_calls_is_slimes_placeholder() -> None:
    rollout = Rollout(rollout_id="empty", group_id="g", status="failed", error="boom")
    groups = to_sample_dicts([single_turn_rollout("a", "g"), rollout], pad_token_id=7)
    (group,) = groups
    assert len(group) == 2
    s = group[1]
    _check_common(s)
    # the placeholder slime's own agent examples build: two pads, one masked response token
    assert s["tokens"] == [7, 7] and s["response_length"] == 1
    assert s["loss_mask"] == [0] and s["rollout_log_probs"] == [0.0]
    assert s["remove_sample"] is True and s["status"] == "failed"
    assert s["rollout_routed_experts"] is None  # the batch has no routing
    assert s["metadata"]["rollwire"]["placeholder"] is True
    assert rollwire_slime.adapter.flatten(groups)[0].rollout_id == "a"  # placeholder left out


def test_placeholder_in_a_routed_batch_has_distinct_dummy_experts() -> None:
    empty = Rollout(rollout_id="empty", group_id="g1", status="failed", error="crashed")
    (group,) = to_sample_dicts([empty, moe_rollout("m", "g1")])
    s = group[0]
    experts = np.asarray(s["rollout_routed_experts"])
    assert experts.shape == (1, LAYERS, TOP_K)
    for layer in range(LAYERS):
        assert len(set(experts[0, layer].tolist())) == TOP_K  # slime's replay check passes
    assert s["remove_sample"] is True and s["loss_mask"] == [0]


def test_row_without_routing_in_a_routed_batch_gets_a_flagged_dummy() -> None:
    plain = single_turn_rollout("plain", "g1")
    (group,) = to_sample_dicts([plain, moe_rollout("m", "g1")])
    s = group[0]
    experts = np.asarray(s["rollout_routed_experts"])
    assert experts.shape == (len(s["tokens"]) - 1, LAYERS, TOP_K)
    assert s["metadata"]["rollwire"]["routing_missing"] is True
    assert group[1]["metadata"]["rollwire"]["routing_missing"] is False
    (row, _) = rollwire_slime.adapter.flatten([group])
    assert row.routed_experts is None  # the stand-in is not reported as captured routing
    # under routing replay (the hooks' setting) it trains nothing: it would replay wrong experts
    (rows,) = [
        rollout_sample_dicts(
            plain,
            group_index=0,
            rollout_index=0,
            index_start=0,
            routing_shape=(LAYERS, TOP_K),
            mask_missing_routing=True,
        )
    ]
    assert rows[0]["remove_sample"] is True and not any(rows[0]["loss_mask"])


def test_ids_are_unique_ints_over_the_batch() -> None:
    nested = to_sample_dicts(sample_batch())
    flat = [s for g in nested for s in g]
    assert len({s["index"] for s in flat}) == len(flat)
    assert [s["group_index"] for s in flat] == [0, 0, 0, 0, 1, 1, 1]
    assert [s["rollout_id"] for s in flat] == [0, 1, 2, 2, 3, 4, 5]


def test_groups_are_flat_lists_of_samples() -> None:
    # one nesting for every batch: slime's flattening, filters and abort path all read it
    nested = to_sample_dicts(sample_batch())
    assert [len(g) for g in nested] == [4, 3]
    assert all(isinstance(s, dict) for g in nested for s in g)


def test_group_task_gives_label() -> None:
    group = Group(group_id="g", task={"label": "yes"}, rollouts=[single_turn_rollout("a", "g")])
    (s,) = to_sample_dicts([group])[0]
    assert s["label"] == "yes"


def test_export_one_sample_per_line(tmp_path: Path) -> None:
    out = rollwire_slime.adapter.export(sample_batch(), tmp_path / "b.jsonl")
    lines = out.read_text().splitlines()
    assert len(lines) == 7
    first = json.loads(lines[0])
    assert set(first) == set(SAMPLE_FIELDS) and first["status"] == "completed"


def test_convert_is_dict_form_without_slime() -> None:
    converted = rollwire_slime.adapter.convert(sample_batch())
    assert isinstance(converted[0][0], dict)


def test_import_is_lazy_and_missing_slime_is_a_clear_error() -> None:
    code = (
        "import sys, rollwire_slime, rollwire_slime.adapter\n"
        "assert 'slime' not in sys.modules, 'importing rollwire_slime imported slime'\n"
        "from rollwire.testing.samples import sample_batch\n"
        "try:\n"
        "    rollwire_slime.to_samples(sample_batch())\n"
        "except ImportError as e:\n"
        "    print(e)\n"
        "else:\n"
        "    raise SystemExit('expected ImportError')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "slime" in done.stdout and "to_sample_dicts" in done.stdout
    assert "pip install" in done.stdout


# -- against the Sample stand-in of conftest.py (written from slime's field list) ---------------


def test_to_samples_end_to_end(slime_types: Any) -> None:
    Sample = slime_types.Sample
    nested = rollwire_slime.to_samples(sample_batch())
    slime_types.validate_rollout_id_annotated(nested)
    flat = slime_types.flatten_like_slime(nested)
    assert all(isinstance(s, Sample) for s in flat)
    assert len(flat) == sum(len(g) for g in nested)
    by_id = {s.metadata["rollwire"]["rollout_id"]: s for s in flat}
    moe = by_id["b0"]
    assert isinstance(moe.rollout_routed_experts, np.ndarray)
    assert moe.rollout_routed_experts.dtype == np.int32
    assert moe.rollout_routed_experts.shape == (len(moe.tokens) - 1, LAYERS, TOP_K)
    assert by_id["a0"].status is Sample.Status.COMPLETED
    # the adapter's own view agrees with the native objects
    flat_rows = rollwire_slime.adapter.flatten(nested)
    assert len(flat_rows) == len(flat)


def test_failed_rollout_trains_nothing(slime_types: Any) -> None:
    Sample = slime_types.Sample
    (group,) = rollwire_slime.to_samples([failed_rollout("x")], failure_reward=-1.0)
    (s,) = group
    assert s.status is Sample.Status.FAILED
    assert s.response_length > 0 and s.loss_mask == [0] * s.response_length
    assert s.rollout_log_probs == [0.0] * s.response_length
    assert s.remove_sample is True and s.reward == -1.0
    (row,) = rollwire_slime.adapter.flatten([[s]])
    assert not row.loss_mask.any()


def test_aborted_rollout_trains_nothing() -> None:
    rollout = single_turn_rollout("t")
    rollout.status = "timeout"
    (s,) = _one(rollout)
    assert s["status"] == "aborted" and s["remove_sample"] is True
    assert s["loss_mask"] == [0] * s["response_length"]


def test_routed_experts_of_the_wrong_length_are_an_error() -> None:
    rollout = moe_rollout("m")
    (row,) = build_rows([rollout])
    assert row.routed_experts is not None
    bad = row.model_copy(update={"routed_experts": row.routed_experts[:-2]})
    with pytest.raises(ValueError, match=r"routed experts have shape \(12, 2, 2\).*= 14"):
        rollout_sample_dicts(rollout, group_index=0, rollout_index=0, index_start=0, rows=[bad])
