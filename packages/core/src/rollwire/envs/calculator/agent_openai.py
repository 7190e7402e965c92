"""The calculator agent, with the plain OpenAI client: type the calculation, read the calculator,
answer (:mod:`rollwire.envs.calculator.game`).

The agent holds the tool: it runs the calculator on the first reply and scores the second. An
infrastructure error (the model endpoint unreachable, 4xx/5xx) is raised, so the rollout is
recorded ``failed`` rather than trained on.
"""

from __future__ import annotations

import os
from typing import Any

from rollwire.agent.app import RolloutApp
from rollwire.agent.context import openai_client, rollout_create_kwargs
from rollwire.envs.calculator.game import calculate, observation, score, task_prompt

__all__ = ["app", "solve"]

app = RolloutApp(failure_reward=0.0)


@app.rollout_entrypoint
def solve(payload: dict[str, Any]) -> dict[str, Any]:
    """One episode: ``{"reward", "metrics": {"solved", "tool_ok"}}`` (``tool_ok``: the
    calculator computed the asked problem)."""
    a, op, b = int(payload["a"]), str(payload["op"]), int(payload["b"])
    client = openai_client(payload, max_retries=2)
    create = rollout_create_kwargs(
        payload, model=os.environ.get("CALCULATOR_MODEL", "gpt-4o-mini"), max_tokens=16
    )
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": payload.get("prompt") or task_prompt(a, op, b)}
    ]
    try:
        first = client.chat.completions.create(messages=messages, **create)  # type: ignore[arg-type]
        typed = first.choices[0].message.content or ""
        result = calculate(typed)
        messages += [
            {"role": "assistant", "content": typed},
            {"role": "user", "content": observation(result)},
        ]
        second = client.chat.completions.create(messages=messages, **create)  # type: ignore[arg-type]
        said = second.choices[0].message.content or ""
    finally:
        client.close()
    expected = int(payload["answer"])
    reward = score(said, expected)
    return {
        "reward": reward,
        "metrics": {"solved": reward, "tool_ok": float(result == str(expected))},
    }
