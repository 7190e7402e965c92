"""The lockbox task: ask the environment for a box's code, then say it.

A rollout is two model calls. The user names a locked box; the policy answers ``read``; the
environment replies with the code (``code 7``: an observation, so it is context in the training
row, masked out of the loss); the policy answers with the digit. Reward 1 for the right digit,
0 otherwise; an answer given without reading first is taken as a guess. Boxes A–M are the
training split and N–Z the held-out one, so held-out prompts are never trained on.

The embedded engine's model is random: :func:`warmup_conversations` is the supervised warm-up
``rollwire train`` runs first. It imitates a teacher who reads the code right only
``teacher_accuracy`` of the time and says a random digit otherwise, so the warmed-up policy has
the format (``read``, then one digit) and gets the code right a little more often than chance —
plausible, not reliable. Reinforcement learning on the reward alone then has to do the rest.
"""

from __future__ import annotations

import random
import re
from typing import Any, Literal

__all__ = [
    "ACTION",
    "SPLITS",
    "Split",
    "answer_of",
    "make_tasks",
    "observation",
    "score",
    "task_prompt",
    "warmup_conversations",
]

Split = Literal["train", "heldout"]
#: box labels per split: held-out prompts name boxes the policy never trained on
SPLITS: dict[str, str] = {"train": "ABCDEFGHIJKLM", "heldout": "NOPQRSTUVWXYZ"}
#: what the policy says to get the code
ACTION = "read"
_DIGIT = re.compile(r"\s*(\d)\s*")


def task_prompt(box: str) -> str:
    """The user's message for ``box``."""
    return f"Box {box} is locked. Read its code, then say the code."


def observation(code: int) -> str:
    """What the environment answers to ``read``."""
    return f"code {code}"


def _boxes(split: str) -> str:
    try:
        return SPLITS[split]
    except KeyError:
        raise ValueError(f"unknown lockbox split {split!r}: use one of {sorted(SPLITS)}") from None


def make_tasks(n: int, split: str = "train", seed: int = 0) -> list[dict[str, Any]]:
    """``n`` tasks ``{"task_id", "box", "code", "prompt"}`` of ``split``, drawn with ``seed``."""
    boxes = _boxes(split)
    rng = random.Random(f"lockbox-{split}-{seed}")
    tasks = []
    for i in range(n):
        box = rng.choice(boxes)
        tasks.append(
            {
                "task_id": f"lockbox-{split}-{seed}-{i}",
                "box": box,
                "code": rng.randrange(10),
                "prompt": task_prompt(box),
            }
        )
    return tasks


def answer_of(text: str | None) -> int | None:
    """The digit an answer names (the whole answer must be one digit), else None."""
    m = _DIGIT.fullmatch(text or "")
    return int(m.group(1)) if m else None


def score(answer: str | None, code: int) -> float:
    """1.0 for the right digit, else 0.0."""
    return 1.0 if answer_of(answer) == int(code) else 0.0


def warmup_conversations(
    n: int, *, teacher_accuracy: float = 0.3, seed: int = 0
) -> list[list[dict[str, str]]]:
    """``n`` teacher conversations on the training split, for the supervised warm-up: ``read``,
    the code, then the code itself with probability ``teacher_accuracy``, else a random digit."""
    if not 0.0 <= teacher_accuracy <= 1.0:
        raise ValueError(f"teacher_accuracy must be in [0, 1], got {teacher_accuracy!r}")
    rng = random.Random(f"lockbox-warmup-{seed}")
    out = []
    for task in make_tasks(n, "train", seed=seed + 10_000):
        code = int(task["code"])
        said = code if rng.random() < teacher_accuracy else rng.randrange(10)
        out.append(
            [
                {"role": "user", "content": str(task["prompt"])},
                {"role": "assistant", "content": ACTION},
                {"role": "user", "content": observation(code)},
                {"role": "assistant", "content": str(said)},
            ]
        )
    return out
