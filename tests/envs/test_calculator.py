"""The calculator task: its tasks and hashed splits, the calculator, the scoring, its warm-up data,
and one agent episode end to end (embedded engine scripted to play it, gateway, RolloutClient):
two calls merged into one row whose calculator observation is context, masked out of the loss."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rollwire.data.trajectory import build_rows
from rollwire.envs.calculator import (
    answer_of,
    calculate,
    make_tasks,
    observation,
    score,
    split_of,
    warmup_conversations,
)
from rollwire.envs.calculator.agent_openai import app
from rollwire.testing.scripted import scripted_rollouts
from rollwire.trainer.client import RolloutClient


def _problem(t: dict[str, Any]) -> tuple[int, str, int]:
    return int(t["a"]), str(t["op"]), int(t["b"])


def test_splits_are_disjoint_problems_and_tasks_are_seeded() -> None:
    train, held = make_tasks(300, "train", seed=1), make_tasks(300, "heldout", seed=1)
    assert not {_problem(t) for t in train} & {_problem(t) for t in held}
    assert all(split_of(*_problem(t)) == "heldout" for t in held)
    assert len({_problem(t) for t in train}) == 300  # no problem twice in one set
    assert make_tasks(50, "train", seed=1) == train[:50] != make_tasks(50, "train", seed=2)
    assert all(t["answer"] == eval(f"{t['a']}{t['op']}{t['b']}") for t in train + held)
    assert all(10 <= t["a"] < 100 and 10 <= t["b"] < 100 for t in train)
    with pytest.raises(ValueError, match="unknown calculator split"):
        make_tasks(1, "test")


def test_the_calculator_evaluates_the_first_calculation_it_finds() -> None:
    assert calculate("63 * 15") == "945"
    assert calculate("Sure: 63 x 15 = 900, then 1 + 1") == "945"
    assert calculate("12+7") == "19" and calculate("12 - 70") == "-58"
    assert calculate("sixty-three times fifteen").startswith("error")
    assert calculate(None).startswith("error")


def test_the_final_answer_is_its_first_number() -> None:
    assert answer_of("945") == 945 and answer_of("The answer is 1,786.") == 1786
    assert answer_of("no idea") is None and answer_of(None) is None
    assert score("945 is the result", 945) == 1.0
    assert score("The result, 63 * 15, is 945", 945) == 0.0  # 63 comes first


def test_warmup_teacher_is_right_as_often_as_asked() -> None:
    convs = warmup_conversations(2000, teacher_accuracy=0.3, seed=0)
    assert all([m["role"] for m in c] == ["user", "assistant", "user", "assistant"] for c in convs)
    right = np.mean([c[2]["content"].split()[1] == c[3]["content"] for c in convs])
    assert 0.26 < right < 0.34
    held = {_problem(t) for t in make_tasks(2000, "heldout", seed=0)}
    asked = {(int(x), op, int(y)) for c in convs for x, op, y in [c[1]["content"].split()]}
    assert not asked & held  # the warm-up never sees a held-out problem


TASK = {"task_id": "t0", **make_tasks(1, "heldout", seed=0)[0]}
#: what the scripted policy says: to the task's prompt, and after the calculator's answer
REPLIES: dict[str, str | None] = {}


def _script(messages: list[dict[str, Any]], tools: Any) -> str | None:
    return REPLIES["first" if messages[-1]["content"] == TASK["prompt"] else "second"]


@pytest.fixture(scope="module")
def client() -> Iterator[tuple[RolloutClient, Any]]:
    with scripted_rollouts(app, _script) as c:
        yield c


def _play(client: tuple[RolloutClient, Any], first: str, second: str) -> Any:
    REPLIES.update(first=first, second=second)
    (group,) = client[0].run([TASK])
    return group.rollouts[0]


def test_typing_the_calculation_then_answering_scores_one_row_with_the_tool_masked(
    client: tuple[RolloutClient, Any],
) -> None:
    a, op, b = _problem(TASK)
    expected = str(TASK["answer"])
    rollout, tok = _play(client, f"{a} {op} {b}", expected), client[1]
    assert rollout.status == "completed" and rollout.reward == 1.0
    assert rollout.metrics == {"solved": 1.0, "tool_ok": 1.0}
    (row,) = build_rows([rollout], tokenizer=tok)  # the second call extends the first: merged
    response = row.response_ids
    sampled = np.concatenate([c.completion_ids for c in rollout.calls])
    np.testing.assert_array_equal(response[row.loss_mask == 1], sampled)
    context = tok.decode(response[row.loss_mask == 0].tolist())
    assert observation(expected) in context  # the calculator's answer is context, mask 0


def test_a_wrong_calculation_or_answer_scores_zero(client: tuple[RolloutClient, Any]) -> None:
    a, op, b = _problem(TASK)
    wrong = _play(client, f"{a} {op} {b + 1}", str(TASK["answer"] + 1))
    assert wrong.reward == 0.0 and wrong.metrics == {"solved": 0.0, "tool_ok": 0.0}
    lucky = _play(client, "I cannot", str(TASK["answer"]))  # no calculation, right anyway
    assert lucky.reward == 1.0 and lucky.metrics["tool_ok"] == 0.0
