"""The lockbox agent, with the plain OpenAI client: ask for the code, then answer.

The agent holds the environment: it replies to ``read`` with the code and scores the answer
(:mod:`rollwire.envs.lockbox.game`). An infrastructure error (the model endpoint unreachable,
4xx/5xx) is raised, so the rollout is recorded ``failed`` rather than trained on.
"""

from __future__ import annotations

import os
from typing import Any

from rollwire.agent.app import RolloutApp
from rollwire.agent.context import openai_client, rollout_create_kwargs
from rollwire.envs.lockbox.game import ACTION, observation, score, task_prompt

__all__ = ["app", "play"]

app = RolloutApp(failure_reward=0.0)


@app.rollout_entrypoint
def play(payload: dict[str, Any]) -> dict[str, Any]:
    """One lockbox episode: ``{"reward", "metrics": {"solved", "read", "turns"}}``."""
    code = int(payload["code"])
    client = openai_client(payload, max_retries=2)
    create = rollout_create_kwargs(
        payload, model=os.environ.get("LOCKBOX_MODEL", "gpt-4o-mini"), max_tokens=8
    )
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": payload.get("prompt") or task_prompt(str(payload["box"]))}
    ]
    try:
        first = client.chat.completions.create(messages=messages, **create)  # type: ignore[arg-type]
        said = first.choices[0].message.content or ""
        read = said.strip().lower() == ACTION
        turns = 1
        if read:
            messages += [
                {"role": "assistant", "content": said},
                {"role": "user", "content": observation(code)},
            ]
            second = client.chat.completions.create(messages=messages, **create)  # type: ignore[arg-type]
            said = second.choices[0].message.content or ""
            turns = 2
    finally:
        client.close()
    reward = score(said, code)
    return {
        "reward": reward,
        "metrics": {"solved": reward, "read": float(read), "turns": float(turns)},
    }
