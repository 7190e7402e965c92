"""Tasks files for the vault task in each environment standard, and the supervised warm-up.

``python make_tasks.py openenv --url http://127.0.0.1:8001`` (or ``verifiers``, or ``nemo-gym
--url http://127.0.0.1:11002``) writes ``tasks.jsonl`` (boxes A-M) and ``heldout.jsonl``
(boxes N-Z) for ``rollwire train --agent rollwire.envs.hubs.<standard>:app``; ``sft.jsonl``
holds teacher conversations for ``--sft`` (read the code, then open the box; the code right
30 % of the time), since the embedded engine's model starts out random.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rollwire.envs.vault.game import SYSTEM_PROMPT, TOOLS, make_tasks, warmup_conversations

__all__ = ["nemo_gym_tasks", "openenv_tasks", "teacher", "verifiers_tasks", "write"]


def openenv_tasks(n: int, split: str, seed: int, url: str) -> list[dict[str, Any]]:
    """Tasks for ``rollwire.envs.hubs.openenv:app`` on the server at ``url``."""
    return [
        {
            "env_url": url,
            "reset": {"box": t["box"], "code": t["code"]},
            "prompt": t["prompt"],
            "system": SYSTEM_PROMPT,
        }
        for t in make_tasks(n, split, seed)
    ]


def verifiers_tasks(n: int, split: str, seed: int, url: str = "") -> list[dict[str, Any]]:
    """Tasks for ``rollwire.envs.hubs.verifiers_env:app``: taskset ``verifiers_vault``."""
    config = {"split": split, "num_tasks": n, "seed": seed}
    return [
        {"taskset": "verifiers_vault", "taskset_config": config, "task_idx": i} for i in range(n)
    ]


def nemo_gym_tasks(n: int, split: str, seed: int, url: str) -> list[dict[str, Any]]:
    """NeMo Gym dataset rows for the agent server at ``url`` (``rollwire.envs.hubs.nemo_gym``)."""
    tools = [{**t["function"], "type": "function", "strict": False} for t in TOOLS]
    return [
        {
            "agent_url": url,
            "responses_create_params": {
                "input": [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": t["prompt"]},
                ],
                "tools": tools,
                "max_output_tokens": 64,
            },
            "box": t["box"],
            "code": t["code"],
        }
        for t in make_tasks(n, split, seed)
    ]


MAKERS = {"openenv": openenv_tasks, "verifiers": verifiers_tasks, "nemo-gym": nemo_gym_tasks}


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def teacher(
    n: int, *, tools: list[dict[str, Any]] | None = None, system: str | None = SYSTEM_PROMPT
) -> list[dict[str, Any]]:
    """``n`` teacher conversations for ``--sft``, in the ``tools`` and ``system`` prompt that the
    environment presents to the policy (a small model learns the exact prompt it is shown)."""
    out = []
    for conversation in warmup_conversations(n, teacher_accuracy=0.3):
        messages = [m for m in conversation["messages"] if m["role"] != "system"]
        if system:
            messages.insert(0, {"role": "system", "content": system})
        out.append({"messages": messages, "tools": tools or conversation["tools"]})
    return out


def write(
    folder: Path, standard: str, url: str = "", *, n: int = 16, heldout: int = 4, **presented: Any
) -> None:
    """``tasks.jsonl``, ``heldout.jsonl`` and ``sft.jsonl`` (``presented``: :func:`teacher`'s
    ``tools`` and ``system``) in ``folder``."""
    make = MAKERS[standard]
    _jsonl(folder / "tasks.jsonl", make(n, "train", 0, url))
    _jsonl(folder / "heldout.jsonl", make(heldout, "heldout", 1, url))
    _jsonl(folder / "sft.jsonl", teacher(256, **presented))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("standard", choices=sorted(MAKERS))
    parser.add_argument("--url", default="", help="the environment's server (not for verifiers)")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    write(args.out, args.standard, args.url)
