"""The relay task's pieces: the splits, the note and action parsers, and a teacher whose
conversations teach both roles' formats at the accuracy asked."""

from __future__ import annotations

from rollwire.envs.relay import (
    ROLES,
    action_of,
    executor_prompt,
    make_tasks,
    note_of,
    planner_prompt,
    warmup_conversations,
)


def test_tasks_are_seeded_and_the_splits_disjoint() -> None:
    train, held = make_tasks(50, "train", 0), make_tasks(50, "heldout", 0)
    assert make_tasks(50, "train", 0) == train
    assert not {t["room"] for t in train} & {t["room"] for t in held}
    assert train[0]["prompt"] == planner_prompt(train[0]["room"], train[0]["secret"])
    assert ROLES == ("planner", "executor")


def test_notes_and_actions_parse_one_digit_only() -> None:
    assert note_of("note 7") == 7 and note_of(" note 3 ") == 3
    assert note_of("7") is None and note_of("note 77") is None
    assert action_of("4") == 4 and action_of("note 4") is None and action_of(None) is None
    assert "note 5" in executor_prompt("A", "note 5")


def test_the_teacher_teaches_both_roles_at_its_accuracy() -> None:
    conversations = warmup_conversations(2000, teacher_accuracy=0.3, seed=0)
    planner = [c for c in conversations if "secret" in c[0]["content"]]
    executor = [c for c in conversations if "note says" in c[0]["content"]]
    assert len(planner) == len(executor) == 1000
    right = sum(note_of(c[1]["content"]) == int(c[0]["content"].split()[5][0]) for c in planner)
    assert 0.3 < right / 1000 < 0.45  # 0.3 + 0.7 * 0.1 by chance
    for c in executor:
        assert action_of(c[1]["content"]) is not None
