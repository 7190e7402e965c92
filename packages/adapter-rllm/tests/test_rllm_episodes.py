"""rLLM Episode dicts against DESIGN §9, field by field, on rollwire's hand-made rollouts."""

from __future__ import annotations

import base64
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict, Field

import rollwire_rllm
from rollwire.data.protocol import Rollout
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
from rollwire_rllm import decode_routing_matrix, episode_rows, to_episode_dicts

EPISODE_KEYS = {"id", "task", "termination_reason", "is_correct", "trajectories", "metrics", "info"}
TRAJECTORY_KEYS = {"uid", "name", "task", "steps", "reward", "info"}
STEP_KEYS = {
    "prompt_ids",
    "response_ids",
    "logprobs",
    "routing_matrices",
    "chat_completions",
    "observation",
    "thought",
    "action",
    "model_response",
    "model_output",
    "info",
    "reward",
    "done",
    "mc_return",
    "advantage",
    "weight_version",
}
MODEL_OUTPUT_KEYS = {
    "text",
    "content",
    "reasoning",
    "tool_calls",
    "prompt_ids",
    "completion_ids",
    "multi_modal_inputs",
    "logprobs",
    "prompt_logprobs",
    "routing_matrices",
    "prompt_length",
    "completion_length",
    "finish_reason",
    "weight_version",
    "metrics",
}


class TestRllmConformance(TrainerAdapterConformance):
    # flatten rebuilds rows from steps' ids; routing is checked per format in test_rllm_routing.
    exports_routed_experts = False

    @pytest.fixture
    def adapter(self) -> Any:
        return rollwire_rllm.adapter


def _episode(rollout: Rollout) -> dict[str, Any]:
    (ep,) = to_episode_dicts([rollout])
    assert set(ep) == EPISODE_KEYS
    (traj,) = ep["trajectories"]
    assert set(traj) == TRAJECTORY_KEYS
    for step in traj["steps"]:
        assert set(step) == STEP_KEYS
        assert set(step["model_output"]) == MODEL_OUTPUT_KEYS
        assert len(step["logprobs"]) == len(step["response_ids"])
        mo = step["model_output"]
        assert (
            mo["prompt_ids"] == step["prompt_ids"] and mo["completion_ids"] == step["response_ids"]
        )
        assert mo["prompt_length"] == len(step["prompt_ids"])
    json.dumps(ep)
    return ep


def test_single_turn() -> None:
    rollout = single_turn_rollout("r1", "g7", reward=1.0)
    rollout.task = {"prompt": "2+2?", "answer": "4"}
    ep = _episode(rollout)
    assert ep["id"] == "g7:0"
    assert ep["task"] == {"prompt": "2+2?", "answer": "4"}
    assert ep["termination_reason"] == "env_done" and ep["is_correct"] is True
    assert ep["metrics"] == {"turns": 1.0}
    (traj,) = ep["trajectories"]
    assert traj["reward"] == 1.0 and traj["name"] == "agent"
    (step,) = traj["steps"]
    call = rollout.calls[0]
    assert step["prompt_ids"] == call.prompt_ids.tolist()
    assert step["response_ids"] == call.completion_ids.tolist()
    np.testing.assert_allclose(step["logprobs"], call.logprobs, atol=1e-6)
    assert step["chat_completions"][:-1] == call.request["messages"]
    assert step["chat_completions"][-1]["role"] == "assistant"
    assert step["reward"] == 1.0 and step["done"] is True
    assert step["routing_matrices"] is None
    assert step["model_output"]["finish_reason"] == "stop"
    assert step["info"]["rollwire"]["call_id"] == call.call_id
    assert ep["info"]["rollwire"]["rollout_id"] == "r1"


def test_merged_three_calls_are_three_exact_steps() -> None:
    rollout = merged_rollout("m", reward=0.5)
    ep = _episode(rollout)
    steps = ep["trajectories"][0]["steps"]
    assert len(steps) == 3
    for step, call in zip(steps, rollout.calls):
        assert step["prompt_ids"] == call.prompt_ids.tolist()
        assert step["response_ids"] == call.completion_ids.tolist()
        # each prompt extends the previous step's prompt + response: rLLM merges them itself
    for prev, nxt in itertools.pairwise(steps):
        head = prev["prompt_ids"] + prev["response_ids"]
        assert nxt["prompt_ids"][: len(head)] == head
    assert [s["reward"] for s in steps] == [0.0, 0.0, 0.5]
    assert [s["done"] for s in steps] == [False, False, True]
    (row,) = episode_rows(ep)
    (expected,) = build_rows([rollout])
    np.testing.assert_array_equal(row.input_ids, expected.input_ids)
    np.testing.assert_array_equal(row.loss_mask, expected.loss_mask)


def test_forked_rollout_is_one_episode_with_two_rows() -> None:
    rollout = forked_rollout("f", reward=-0.5)
    ep = _episode(rollout)
    steps = ep["trajectories"][0]["steps"]
    assert len(steps) == 3
    assert steps[2]["info"]["rollwire"]["fork"]["position"] == 9
    assert [s["info"]["rollwire"]["row_index"] for s in steps] == [0, 0, 1]
    rows = episode_rows(ep)
    assert len(rows) == 2 and {r.rollout_id for r in rows} == {"f"}
    assert ep["is_correct"] is False and ep["trajectories"][0]["reward"] == -0.5


def test_failed_rollout() -> None:
    (ep,) = to_episode_dicts([failed_rollout("x")])
    assert set(ep) == EPISODE_KEYS
    assert ep["termination_reason"] == "error"
    assert ep["is_correct"] is False
    # like rLLM's own Episode for a failed flow: no trajectories, so nothing of it is trained
    assert ep["trajectories"] == []
    assert ep["info"]["rollwire"]["trainable"] is False
    assert ep["info"]["rollwire"]["error"] == "RuntimeError: tool crashed"
    assert ep["info"]["rollwire"]["reward"] is None
    assert ep["info"]["rollwire"]["num_calls"] == 1
    assert episode_rows(ep) == []


def test_moe_routing_matrices_per_token_in_tinker_form() -> None:
    rollout = moe_rollout("moe")
    (ep,) = to_episode_dicts([rollout], routing_format="tinker")
    for step, call in zip(ep["trajectories"][0]["steps"], rollout.calls):
        matrices = step["routing_matrices"]
        assert matrices == step["model_output"]["routing_matrices"]
        assert len(matrices) == len(step["response_ids"])
        p = len(step["prompt_ids"])
        for j, entry in enumerate(matrices):
            header = json.loads(entry)[0]
            assert header == {"shape": [LAYERS, TOP_K], "dtype": "int16"}
            m = decode_routing_matrix(entry)
            assert m.shape == (LAYERS, TOP_K)
            assert call.routed_experts is not None
            np.testing.assert_array_equal(m, call.routed_experts[p + j - 1])


@pytest.mark.parametrize(
    ("status", "finish", "expected"),
    [
        ("completed", "stop", "env_done"),
        ("completed", "length", "max_response_length_exceeded"),
        ("timeout", "stop", "timeout"),
        ("cancelled", "stop", "unknown"),
        ("failed", "stop", "error"),
    ],
)
def test_termination_reason(status: str, finish: str, expected: str) -> None:
    rollout = single_turn_rollout()
    rollout.status = status  # type: ignore[assignment]
    rollout.calls[0].finish_reason = finish
    assert to_episode_dicts([rollout])[0]["termination_reason"] == expected


def test_is_correct_prefers_a_metric() -> None:
    rollout = single_turn_rollout(reward=0.2)
    rollout.metrics = {"is_correct": 0.0}
    assert to_episode_dicts([rollout])[0]["is_correct"] is False


def test_ids_and_weight_versions() -> None:
    eps = to_episode_dicts(sample_batch())
    assert [e["id"] for e in eps] == ["g0:0", "g0:1", "g0:2", "g1:0", "g1:1", "g1:2"]
    rollout = merged_rollout()
    for i, call in enumerate(rollout.calls):
        call.policy_version = str(i) if i else "v-a"
    steps = to_episode_dicts([rollout])[0]["trajectories"][0]["steps"]
    # rLLM types weight_version as int: a non-numeric version is None there, kept in info
    assert [s["weight_version"] for s in steps] == [None, 1, 2]
    assert steps[0]["info"]["rollwire"]["policy_version"] == "v-a"


def test_task_id_with_colon_is_escaped() -> None:
    # rLLM reads Episode.id.split(":")[0] as the task id and groups by it
    rollout = single_turn_rollout("r", group_id="gsm8k:12")
    (ep,) = to_episode_dicts([rollout])
    assert ep["id"] == "gsm8k%3A12:0"
    assert ep["id"].split(":") == ["gsm8k%3A12", "0"]
    assert ep["info"]["rollwire"]["task_id"] == "gsm8k:12"


def test_response_message_from_captured_response() -> None:
    rollout = single_turn_rollout()
    msg = {"role": "assistant", "content": "hi", "tool_calls": [{"id": "t", "type": "function"}]}
    rollout.calls[0].response = {"choices": [{"message": msg}]}
    step = to_episode_dicts([rollout])[0]["trajectories"][0]["steps"][0]
    assert step["chat_completions"][-1] == msg
    assert (
        step["model_response"] == "hi" and step["model_output"]["tool_calls"] == msg["tool_calls"]
    )


def test_non_trainable_call_round_trips_through_flatten() -> None:
    rollout = merged_rollout()
    rollout.calls[1].trainable = False
    (row,) = episode_rows(to_episode_dicts([rollout])[0])
    (expected,) = build_rows([rollout])
    np.testing.assert_array_equal(row.loss_mask, expected.loss_mask)
    np.testing.assert_allclose(row.logprobs, expected.logprobs)


def test_retried_and_off_policy_calls_are_not_steps() -> None:
    """rLLM trains every step it gets: only calls rollwire would train become steps."""
    rollout = merged_rollout()
    retried = rollout.calls[0].model_copy(update={"call_id": "retried", "index": 0})
    retried.flags = ["superseded_by_retry"]
    retried.trainable = False
    rollout.calls[1].off_policy = True
    rollout.calls[1].trainable = False
    rollout.calls = [retried, *rollout.calls]
    (traj,) = to_episode_dicts([rollout])[0]["trajectories"]
    assert [len(s["response_ids"]) for s in traj["steps"]] == [4, 3]
    assert traj["info"]["rollwire"]["left_out_calls"] == ["retried", rollout.calls[2].call_id]
    (row,) = episode_rows(to_episode_dicts([rollout])[0])
    (expected,) = build_rows([rollout])
    np.testing.assert_array_equal(row.loss_mask, expected.loss_mask)


def test_export_one_episode_per_line(tmp_path: Path) -> None:
    out = rollwire_rllm.adapter.export(sample_batch(), tmp_path / "e.jsonl")
    lines = out.read_text().splitlines()
    assert len(lines) == 6
    assert set(json.loads(lines[0])) == EPISODE_KEYS


def test_import_is_lazy_and_missing_rllm_is_a_clear_error() -> None:
    code = (
        "import sys, rollwire_rllm\n"
        "assert 'rllm' not in sys.modules, 'importing rollwire_rllm imported rllm'\n"
        "from rollwire.testing.samples import sample_batch\n"
        "try:\n"
        "    rollwire_rllm.to_episodes(sample_batch())\n"
        "except ImportError as e:\n"
        "    print(e)\n"
        "else:\n"
        "    raise SystemExit('expected ImportError')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "rLLM" in done.stdout and "to_episode_dicts" in done.stdout
    assert "pip install" in done.stdout


# -- rLLM's real classes: test_rllm_contract.py (recorded) ------------------------------------


def test_a_field_the_installed_rllm_lacks_is_a_warning() -> None:
    class OldStep(BaseModel):
        """An rLLM Step from before R3: token fields, no routing_matrices."""

        model_config = ConfigDict(arbitrary_types_allowed=True)
        prompt_ids: list[int] = Field(default_factory=list)
        response_ids: list[int] = Field(default_factory=list)
        logprobs: list[float] = Field(default_factory=list)
        chat_completions: list[dict[str, Any]] = Field(default_factory=list)
        model_output: Any = None
        metadata: dict[str, Any] | None = None
        reward: float = 0.0
        done: bool = False
        advantage: Any = None
        weight_version: int | None = None

    from rollwire_rllm.episodes import _construct

    step = to_episode_dicts([moe_rollout()])[0]["trajectories"][0]["steps"][0]
    assert step["routing_matrices"]
    with pytest.warns(RuntimeWarning, match="no field routing_matrices"):
        old = _construct(OldStep, {**step, "model_output": None})
    assert old.response_ids == step["response_ids"]


@pytest.mark.parametrize("width", range(1, 8))
def test_routing_entries_are_standard_base64_per_token(width: int) -> None:
    from rollwire_rllm.routing import _b64_rows

    rows = np.random.default_rng(width).integers(0, 256, (5, width)).astype(np.uint8)
    expected = [base64.b64encode(r.tobytes()).decode() for r in rows]
    assert _b64_rows(rows).tolist() == expected
