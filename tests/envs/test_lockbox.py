"""The lockbox task: its tasks and splits, its warm-up data, and one agent episode end to end
(embedded engine scripted to play it, gateway, RolloutClient): two calls merged into one row
whose environment observation is context, masked out of the loss."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rollwire.data.trajectory import build_rows
from rollwire.envs.lockbox import (
    ACTION,
    SPLITS,
    answer_of,
    make_tasks,
    observation,
    score,
    warmup_conversations,
)
from rollwire.envs.lockbox.agent_openai import app
from rollwire.testing.scripted import scripted_rollouts
from rollwire.trainer.client import RolloutClient


def test_splits_name_disjoint_boxes_and_tasks_are_seeded() -> None:
    train, held = make_tasks(50, "train", seed=1), make_tasks(50, "heldout", seed=1)
    assert {t["box"] for t in train} <= set(SPLITS["train"])
    assert {t["box"] for t in held} <= set(SPLITS["heldout"])
    assert not set(SPLITS["train"]) & set(SPLITS["heldout"])
    assert make_tasks(50, "train", seed=1) == train != make_tasks(50, "train", seed=2)
    assert len({t["task_id"] for t in train}) == 50
    with pytest.raises(ValueError, match="unknown lockbox split"):
        make_tasks(1, "test")


def test_answers_are_one_digit() -> None:
    assert answer_of(" 7\n") == 7
    assert answer_of("7 8") is None and answer_of("seven") is None and answer_of(None) is None
    assert score("3", 3) == 1.0 and score("4", 3) == 0.0


def test_warmup_teacher_is_right_as_often_as_asked() -> None:
    convs = warmup_conversations(2000, teacher_accuracy=0.3, seed=0)
    assert all([m["role"] for m in c] == ["user", "assistant", "user", "assistant"] for c in convs)
    assert all(c[1]["content"] == ACTION for c in convs)
    right = np.mean([c[3]["content"] == c[2]["content"].split()[-1] for c in convs])
    assert 0.3 + 0.7 * 0.1 - 0.04 < right < 0.3 + 0.7 * 0.1 + 0.04  # right by chance, too
    boxes = {c[0]["content"].split()[1] for c in convs}
    assert boxes <= set(SPLITS["train"])  # the warm-up never sees a held-out box


TASK = {
    "task_id": "t0",
    "box": "N",
    "code": 7,
    "prompt": "Box N is locked. Read its code, then say the code.",
}
#: what the scripted policy says: to the task's prompt, and after the observation
REPLIES: dict[str, str | None] = {}


def _script(messages: list[dict[str, Any]], tools: Any) -> str | None:
    return REPLIES["first" if messages[-1]["content"] == TASK["prompt"] else "second"]


@pytest.fixture(scope="module")
def client() -> Iterator[tuple[RolloutClient, Any]]:
    with scripted_rollouts(app, _script) as c:
        yield c


def _play(client: tuple[RolloutClient, Any], second: str | None, first: str = ACTION) -> Any:
    REPLIES.update(first=first, second=second)
    (group,) = client[0].run([TASK])
    return group.rollouts[0]


def test_reading_then_saying_the_code_scores_one_row_with_the_observation_masked(
    client: tuple[RolloutClient, Any],
) -> None:
    rollout, tok = _play(client, "7"), client[1]
    assert rollout.status == "completed" and rollout.reward == 1.0
    assert rollout.metrics == {"solved": 1.0, "read": 1.0, "turns": 2.0}
    (row,) = build_rows([rollout], tokenizer=tok)  # the second call extends the first: merged
    response = row.response_ids
    masked_in = response[row.loss_mask == 1]
    sampled = np.concatenate([c.completion_ids for c in rollout.calls])
    np.testing.assert_array_equal(masked_in, sampled)  # only what the policy produced trains
    context = tok.decode(response[row.loss_mask == 0].tolist())
    assert observation(7) in context  # the environment's answer is context, mask 0


def test_a_wrong_code_or_no_read_scores_zero(client: tuple[RolloutClient, Any]) -> None:
    rollout = _play(client, "3")
    assert rollout.reward == 0.0 and rollout.metrics["read"] == 1.0
    guessed = _play(client, None, first="7")  # answered without reading: one call, taken as a guess
    assert guessed.reward == 1.0 and guessed.metrics == {"solved": 1.0, "read": 0.0, "turns": 1.0}
