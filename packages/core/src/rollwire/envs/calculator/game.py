"""The calculator task: a two-operand arithmetic question, a calculator tool, a final answer.

A rollout is two model calls. The user asks ``What is 63 * 15?`` and tells the policy to type the
calculation; the policy's reply is given to the calculator, which evaluates the first
``a op b`` it finds in it (``calculator: 945``, or ``calculator: error ...`` when there is none)
— a tool observation, so it is context in the training row, masked out of the loss; the policy
then gives the final answer. Reward 1 when the first number of that answer is the right result
(whatever the calculator said), 0 otherwise.

The operands are two-digit numbers, so a small model cannot do the arithmetic itself: it has to
type the right calculation and copy the result. SmolLM2-135M-Instruct gets that right about 45 %
of the time at temperature 1 (it rambles, types other numbers, or answers with something else
first), which leaves room to learn in both turns. Held-out problems are never trained on: a
problem's split is fixed by a hash of the problem itself.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any, Literal

__all__ = [
    "OPERATORS",
    "SPLITS",
    "Split",
    "answer_of",
    "calculate",
    "make_tasks",
    "observation",
    "score",
    "split_of",
    "task_prompt",
    "warmup_conversations",
]

Split = Literal["train", "heldout"]
SPLITS: tuple[str, ...] = ("train", "heldout")
#: the operators of the questions; the calculator also reads ``x`` and ``×`` as times, and ``-``
OPERATORS = ("+", "*")
_EXPR = re.compile(r"(-?\d+)\s*([-+*x×])\s*(-?\d+)")
_NUMBER = re.compile(r"-?\d+")
#: one problem in this many is held out
_HELDOUT_EVERY = 4


def task_prompt(a: int, op: str, b: int) -> str:
    """The user's message for ``a op b``."""
    return f"What is {a} {op} {b}? Type the calculation for the calculator."


def observation(result: str) -> str:
    """What the environment answers after the calculator ran (``result`` is its output)."""
    return f"calculator: {result}\nWhat is the final answer?"


def calculate(text: str | None) -> str:
    """The calculator: the value of the first ``a op b`` in ``text``, or an error message."""
    m = _EXPR.search(text or "")
    if m is None:
        return "error: no calculation found"
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return str(_apply(a, op, b))


def _apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    return a * b  # "*", "x", "×"


def split_of(a: int, op: str, b: int) -> Split:
    """The split a problem belongs to (a hash of the problem: the same on every machine)."""
    digest = hashlib.sha256(f"{a}{op}{b}".encode()).digest()
    return "heldout" if digest[0] % _HELDOUT_EVERY == 0 else "train"


def make_tasks(n: int, split: str = "train", seed: int = 0) -> list[dict[str, Any]]:
    """``n`` distinct tasks ``{"task_id", "a", "op", "b", "answer", "prompt"}`` of ``split``,
    drawn with ``seed``."""
    if split not in SPLITS:
        raise ValueError(f"unknown calculator split {split!r}: use one of {list(SPLITS)}")
    rng = random.Random(f"calculator-{split}-{seed}")
    tasks: list[dict[str, Any]] = []
    seen: set[tuple[int, str, int]] = set()
    while len(tasks) < n:
        a, b, op = rng.randrange(10, 100), rng.randrange(10, 100), rng.choice(OPERATORS)
        if split_of(a, op, b) != split or (a, op, b) in seen:
            continue
        seen.add((a, op, b))
        tasks.append(
            {
                "task_id": f"calculator-{split}-{seed}-{len(tasks)}",
                "a": a,
                "op": op,
                "b": b,
                "answer": _apply(a, op, b),
                "prompt": task_prompt(a, op, b),
            }
        )
    return tasks


def answer_of(text: str | None) -> int | None:
    """The first integer in a final answer, else None."""
    m = _NUMBER.search((text or "").replace(",", ""))
    return int(m.group(0)) if m else None


def score(answer: str | None, expected: int) -> float:
    """1.0 when the answer's first number is ``expected``, else 0.0."""
    return 1.0 if answer_of(answer) == int(expected) else 0.0


def warmup_conversations(
    n: int, *, teacher_accuracy: float = 0.3, seed: int = 0
) -> list[list[dict[str, str]]]:
    """``n`` teacher conversations on the training split (for a supervised warm-up): the
    calculation, the calculator's answer, then the result with probability ``teacher_accuracy``
    and a near miss otherwise."""
    if not 0.0 <= teacher_accuracy <= 1.0:
        raise ValueError(f"teacher_accuracy must be in [0, 1], got {teacher_accuracy!r}")
    rng = random.Random(f"calculator-warmup-{seed}")
    out = []
    for task in make_tasks(n, "train", seed=seed + 10_000):
        typed = f"{task['a']} {task['op']} {task['b']}"
        result = int(task["answer"])
        said = result if rng.random() < teacher_accuracy else result + rng.choice((-10, -1, 1, 10))
        out.append(
            [
                {"role": "user", "content": str(task["prompt"])},
                {"role": "assistant", "content": typed},
                {"role": "user", "content": observation(calculate(typed))},
                {"role": "assistant", "content": str(said)},
            ]
        )
    return out
