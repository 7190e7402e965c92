"""The relay task: two roles, each its own policy (``rollwire train --roles planner,executor``).

A rollout is two model calls by two roles. The **planner** (``model="planner"``) is shown a
secret digit and must write it into a note: ``note 7``. The **executor** (``model="executor"``)
sees the note alone and must act on it: answer the note's digit. Reward 1 when the executor's
digit is the secret, so both roles must be right; a wrong note makes the executor's action
wrong however well it reads. Each role has its own measure in the rollout's metrics:
``note_correct`` (the planner's) and ``action_follows_note`` (the executor's, over notes that
name a digit). Rooms A–M are the training split, N–Z the held-out one.

The embedded engine's model is random: :func:`warmup_conversations` imitates a teacher who gets
each role right only ``teacher_accuracy`` of the time (a random digit otherwise), as lockbox's
does, so both roles start with the format and a little more than chance.
"""

from __future__ import annotations

import random
import re
from typing import Any

__all__ = [
    "ROLES",
    "SPLITS",
    "action_of",
    "executor_prompt",
    "make_tasks",
    "note_of",
    "planner_prompt",
    "warmup_conversations",
]

#: the roles, as the model names their calls ask for
ROLES = ("planner", "executor")
SPLITS: dict[str, str] = {"train": "ABCDEFGHIJKLM", "heldout": "NOPQRSTUVWXYZ"}
_NOTE = re.compile(r"\s*note\s+(\d)\s*")
_DIGIT = re.compile(r"\s*(\d)\s*")


def planner_prompt(room: str, secret: int) -> str:
    """The planner's message: the secret it must pass on."""
    return f"Room {room}: the secret is {secret}. Write the note."


def executor_prompt(room: str, note: str) -> str:
    """The executor's message: the planner's note, nothing else."""
    return f"Room {room}. The note says: {note.strip()[:40]}. Act."


def note_of(text: str | None) -> int | None:
    """The digit a note names (``note D``), else None."""
    m = _NOTE.fullmatch(text or "")
    return int(m.group(1)) if m else None


def action_of(text: str | None) -> int | None:
    """The digit an action names (the whole answer one digit), else None."""
    m = _DIGIT.fullmatch(text or "")
    return int(m.group(1)) if m else None


def make_tasks(n: int, split: str = "train", seed: int = 0) -> list[dict[str, Any]]:
    """``n`` tasks ``{"task_id", "room", "secret", "prompt"}`` of ``split``, drawn with ``seed``."""
    if split not in SPLITS:
        raise ValueError(f"unknown relay split {split!r}: use one of {sorted(SPLITS)}")
    rng = random.Random(f"relay-{split}-{seed}")
    tasks = []
    for i in range(n):
        room, secret = rng.choice(SPLITS[split]), rng.randrange(10)
        tasks.append(
            {
                "task_id": f"relay-{split}-{seed}-{i}",
                "room": room,
                "secret": secret,
                "prompt": planner_prompt(room, secret),
            }
        )
    return tasks


def warmup_conversations(
    n: int, *, teacher_accuracy: float = 0.3, seed: int = 0
) -> list[list[dict[str, str]]]:
    """``n`` teacher conversations on the training split, half of each role: a note naming the
    secret (an executor's digit naming the note's) with probability ``teacher_accuracy``, else
    a random digit."""
    if not 0.0 <= teacher_accuracy <= 1.0:
        raise ValueError(f"teacher_accuracy must be in [0, 1], got {teacher_accuracy!r}")
    rng = random.Random(f"relay-warmup-{seed}")
    out = []
    for i, task in enumerate(make_tasks(n, "train", seed=seed + 10_000)):
        room, secret = str(task["room"]), int(task["secret"])
        right = rng.random() < teacher_accuracy
        if i % 2 == 0:
            said = secret if right else rng.randrange(10)
            out.append(
                [
                    {"role": "user", "content": planner_prompt(room, secret)},
                    {"role": "assistant", "content": f"note {said}"},
                ]
            )
        else:
            note = rng.randrange(10)
            said = note if right else rng.randrange(10)
            out.append(
                [
                    {"role": "user", "content": executor_prompt(room, f"note {note}")},
                    {"role": "assistant", "content": str(said)},
                ]
            )
    return out
