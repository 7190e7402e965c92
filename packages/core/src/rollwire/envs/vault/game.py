"""The vault task: a locked box, two tools, and a code to carry from one tool call to the next.

A rollout is two model calls with real OpenAI tools. The user names a locked box; the policy
calls ``read_code(box)``, whose result (``Box N's code is 482.``) comes back as a ``tool``
message (context in the training row, masked out of the loss); the policy then calls
``open_box(box, code)``. Opening the box ends the episode (the tool returns directly, no third
call). Reward 1 when the box was opened with its code — the outcome only, whatever the policy
said on the way; 0 otherwise (a wrong code, another box, no tool call, text instead of a call).
Both calls are needed: the code is random per task and only ``read_code`` tells it.

Boxes A–M are the training split and N–Z the held-out one. :func:`warmup_conversations` writes
the supervised warm-up data (OpenAI messages with ``tool_calls`` and ``tool`` results, and the
tools): a teacher that always reads first and copies the code right only ``teacher_accuracy`` of
the time, a random three-digit code otherwise — the format is taught, the copying is left to RL.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "SPLITS",
    "SYSTEM_PROMPT",
    "TOOLS",
    "Vault",
    "make_tasks",
    "task_prompt",
    "teacher_conversation",
    "warmup_conversations",
]

#: box labels per split: held-out prompts name boxes the policy never trained on
SPLITS: dict[str, str] = {"train": "ABCDEFGHIJKLM", "heldout": "NOPQRSTUVWXYZ"}
SYSTEM_PROMPT = "You open locked boxes. Use the tools."

#: the tools in OpenAI's ``tools`` format, as LangChain writes the agent's two ``@tool`` functions
#: (key order included: chat templates render them with ``tojson`` unsorted)
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "read_code",
            "description": "Read the code of a locked box.",
            "parameters": {
                "properties": {"box": {"description": "the box's letter", "type": "string"}},
                "required": ["box"],
                "type": "object",
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "open_box",
            "description": "Open a locked box with its code.",
            "parameters": {
                "properties": {
                    "box": {"description": "the box's letter", "type": "string"},
                    "code": {"description": "the box's code", "type": "string"},
                },
                "required": ["box", "code"],
                "type": "object",
            },
        },
    },
]


def task_prompt(box: str) -> str:
    """The user's message for ``box``."""
    return f"Open box {box}."


@dataclass
class Vault:
    """One episode's boxes: ``box`` holds ``code``; tools record what the policy did."""

    box: str
    code: int
    reads: int = 0
    opened: bool = False
    attempts: list[tuple[str, str]] = field(default_factory=list)

    def read_code(self, box: str) -> str:
        """The ``read_code`` tool: the code of the task's box; other boxes are not in this vault."""
        self.reads += 1
        if box.strip().upper() != self.box:
            return f"There is no box {box} here."
        return f"Box {self.box}'s code is {self.code}."

    def open_box(self, box: str, code: str) -> str:
        """The ``open_box`` tool: opens the task's box when ``code`` is its code."""
        self.attempts.append((box, code))
        if box.strip().upper() == self.box and str(code).strip() == str(self.code):
            self.opened = True
            return f"Box {self.box} is open."
        return f"Wrong code: box {box} stays locked."

    def reward(self) -> float:
        """1.0 when the box was opened, else 0.0."""
        return 1.0 if self.opened else 0.0

    def metrics(self) -> dict[str, float]:
        """Per-episode measures: solved, tool calls made, whether the code was read first."""
        return {
            "solved": self.reward(),
            "reads": float(self.reads),
            "open_attempts": float(len(self.attempts)),
        }


def _boxes(split: str) -> str:
    try:
        return SPLITS[split]
    except KeyError:
        raise ValueError(f"unknown vault split {split!r}: use one of {sorted(SPLITS)}") from None


def make_tasks(n: int, split: str = "train", seed: int = 0) -> list[dict[str, Any]]:
    """``n`` tasks ``{"task_id", "box", "code", "prompt"}`` of ``split``, drawn with ``seed``."""
    boxes = _boxes(split)
    rng = random.Random(f"vault-{split}-{seed}")
    return [
        {
            "task_id": f"vault-{split}-{seed}-{i}",
            "box": (box := rng.choice(boxes)),
            "code": rng.randrange(100, 1000),
            "prompt": task_prompt(box),
        }
        for i in range(n)
    ]


def _call(call_id: str, name: str, arguments: dict[str, str]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def teacher_conversation(task: dict[str, Any], said_code: int) -> dict[str, Any]:
    """The conversation of an episode that reads the code and opens the box with ``said_code``,
    as the agent sends it (system, user, assistant tool calls, tool results) with the tools."""
    vault = Vault(str(task["box"]), int(task["code"]))
    box = vault.box
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": str(task["prompt"])},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call("c0", "read_code", {"box": box})],
        },
        {"role": "tool", "tool_call_id": "c0", "content": vault.read_code(box)},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call("c1", "open_box", {"box": box, "code": str(said_code)})],
        },
    ]
    return {"messages": messages, "tools": TOOLS}


def warmup_conversations(
    n: int, *, teacher_accuracy: float = 0.3, seed: int = 0
) -> list[dict[str, Any]]:
    """``n`` teacher conversations ``{"messages", "tools"}`` on the training split (the format of
    ``rollwire train --sft``): read the code, then open the box with it with probability
    ``teacher_accuracy``, else with a random three-digit code."""
    if not 0.0 <= teacher_accuracy <= 1.0:
        raise ValueError(f"teacher_accuracy must be in [0, 1], got {teacher_accuracy!r}")
    rng = random.Random(f"vault-warmup-{seed}")
    out = []
    for task in make_tasks(n, "train", seed=seed + 10_000):
        code = int(task["code"])
        said = code if rng.random() < teacher_accuracy else rng.randrange(100, 1000)
        out.append(teacher_conversation(task, said))
    return out
