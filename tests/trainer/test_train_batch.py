"""The loop's batch, the same for every trainer: every row of a completed rollout trained with its
rollout's advantage, the token counts of ``steps.jsonl``, and the trainer contract run over every
installed trainer plugin that trains (``train_rows``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rollwire.data.protocol import Group
from rollwire.plugins import discover, load_trainer
from rollwire.testing import (
    TrainerLoopConformance,
    failed_rollout,
    forked_rollout,
    side_call_rollout,
    single_turn_rollout,
)
from rollwire.trainer.train_batch import (
    Algorithm,
    behaviour_stats,
    build_train_batch,
    group_advantages,
)


def _training_plugins() -> list[str]:
    names = []
    for info in discover("trainers"):
        if info.status == "ok" and callable(getattr(load_trainer(info.name), "train_rows", None)):
            names.append(info.name)
    return names


TRAINERS = _training_plugins()


def test_the_workspace_installs_both_training_plugins() -> None:
    assert {"trl", "tinker"} <= set(TRAINERS), TRAINERS


class TestEveryInstalledTrainer(TrainerLoopConformance):
    @pytest.fixture(params=TRAINERS)
    def adapter(self, request: pytest.FixtureRequest) -> Any:
        return load_trainer(request.param)


def test_a_side_call_rollout_trains_both_rows_and_counts_every_token() -> None:
    group = Group(group_id="g", rollouts=[side_call_rollout("a", reward=1.0)])
    group.rollouts.append(side_call_rollout("b", reward=0.0))
    batch = build_train_batch([group])
    assert len(batch.rows) == 4 and batch.forked == 2
    # main turn 4 + side 1 + final 5 tokens per rollout, all of them trained
    assert batch.sampled_tokens == batch.trained_tokens == 20
    assert batch.gap_line() is None
    assert batch.prefill_tokens == 2 * (8 + 6 + 15)
    assert batch.truncated_calls == 0


def test_failed_rollouts_train_nothing_and_are_counted_by_cause() -> None:
    good = [single_turn_rollout(f"r{i}", "g1", reward=float(i)) for i in range(3)]
    batch = build_train_batch([*good, failed_rollout("bad", "g1")])
    assert {r.row.rollout_id for r in batch.rows} == {"r0", "r1", "r2"}
    assert batch.sampled_tokens == 3 * 5 + 4 and batch.trained_tokens == 15
    assert batch.untrained == {"rollouts with status failed": 4}
    assert (
        batch.gap_line() == "4 of 19 sampled tokens carried no loss (4 rollouts with status failed)"
    )
    # baseline: the failure's 0 is in the group's mean; drop: it is not
    kept = build_train_batch(
        [*good, failed_rollout("bad", "g1")], Algorithm(scale_advantages=False)
    )
    dropped = build_train_batch(
        [*good, failed_rollout("bad", "g1")],
        Algorithm(scale_advantages=False, failed_rollouts="drop"),
    )
    assert kept.advantages["r2"] == pytest.approx(2.0 - 3.0 / 4)
    assert dropped.advantages["r2"] == pytest.approx(2.0 - 1.0)
    assert "bad" not in dropped.advantages


def test_truncated_calls_are_counted() -> None:
    r = single_turn_rollout("t", "g", 1.0)
    r.calls[0].finish_reason = "length"
    assert build_train_batch([r, single_turn_rollout("u", "g", 0.0)]).truncated_calls == 1


def test_a_forked_rollout_trains_every_row() -> None:
    batch = build_train_batch([forked_rollout("f", "g", 1.0), single_turn_rollout("s", "g", 0.0)])
    rows = [r for r in batch.rows if r.row.rollout_id == "f"]
    assert len(rows) == 2
    assert batch.sampled_tokens == batch.trained_tokens


def test_group_advantages_scale_by_the_sample_std_and_tie_at_zero() -> None:
    adv = group_advantages({"a": 1.0, "b": 0.0}, {"a": "g", "b": "g"}, scale=True)
    assert adv["a"] == pytest.approx(0.5 / (np.std([1.0, 0.0], ddof=1) + 1e-4))
    assert group_advantages({"a": 1.0, "b": 1.0}, {"a": "g", "b": "g"}) == {"a": 0.0, "b": 0.0}
    assert group_advantages({"a": 3.0}, {"a": None}) == {"a": 0.0}


def test_behaviour_stats_is_k3_and_ratios() -> None:
    d = np.array([0.1, -0.2])
    stats = behaviour_stats([np.array([-1.0, -2.0]) + d], [np.array([-1.0, -2.0])])
    assert stats["kl_behaviour"] == pytest.approx(float(np.mean(np.exp(d) - d - 1)))
    assert stats["is_ratio_max"] == pytest.approx(np.exp(0.1))
    assert stats["logp_diff_max"] == pytest.approx(0.2)
    assert behaviour_stats([], []) == {}


def test_an_empty_batch_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        build_train_batch([])


def _tool_rollout(rid: str, message: dict[str, Any], tools: bool = True) -> Any:
    r = single_turn_rollout(rid, "gt", 1.0)
    call = r.calls[0]
    call.request = {"messages": [], **({"tools": [{"type": "function"}]} if tools else {})}
    call.response = {"choices": [{"message": message}]}
    return r


def test_tool_call_health_counts_parsed_calls_and_unparsed_tool_text() -> None:
    parsed = {"content": None, "tool_calls": [{"function": {"name": "guess", "arguments": "{}"}}]}
    drifted = {"content": '<tool_call>{"name": "guess", "arguments": {}}</tool_call>'}
    bare = {"content": '{"name": "guess", "arguments": {"word": "crane"}}'}
    plain = {"content": "the answer is 7"}
    healthy = build_train_batch([_tool_rollout("a", parsed), _tool_rollout("b", plain)])
    assert (healthy.tools.offered, healthy.tools.parsed, healthy.tools.unparsed) == (2, 1, 0)
    assert not healthy.tools.none_parsed
    # a server whose parser does not match the model's format: text, no tool_calls — flagged
    broken = build_train_batch([_tool_rollout("c", drifted), _tool_rollout("d", bare)])
    assert (broken.tools.offered, broken.tools.parsed, broken.tools.unparsed) == (2, 0, 2)
    assert broken.tools.none_parsed
    # no tools offered: nothing to flag
    quiet = build_train_batch([_tool_rollout("e", plain, tools=False)])
    assert quiet.tools.offered == 0 and not quiet.tools.none_parsed
